"""Drafter training-step benchmark on one GPU: model FLOPs, step time and MFU.

Default shape: a Qwen3-8B-shaped drafter (5 layers, hidden 4096, B = 16, 512 anchors, one
sequence of 3072). The step timed is what a drafter rank does per batch: anchors, mask, drafter
forward and backward, chunked lm_head loss, clipping and AdamW; the target's forward is not in
it (it runs on target ranks). Frozen weights and features are random: speed does not depend on
their values.

    python bench/trainer/drafter_step.py [--compile] [--seq-len 3072 --anchors 512 ...]

FLOPs count the useful matmul work: forward + 2x for the backward of trainable layers; the
fc and the frozen lm_head have one input of their backward less (2x forward in all); attention
counts the keys each query may see (context before its anchor plus its own block).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from dflash.model import DrafterConfig
from dflash.objective import sample_anchors
from dflash.optimizer import clip_and_step
from dflash.options import build_drafter
from dflash.pipeline import FeatureBatch
from dflash.step import DrafterStep


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The drafter's shape (default: Qwen3-8B's); checkpoint_load.py shares it."""
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=12288)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--features", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)


def shaped_drafter(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> tuple[DrafterConfig, torch.nn.Module]:
    """The drafter of `add_shape_args`' shape, with random frozen embedding and lm_head."""
    cfg = DrafterConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        vocab_size=args.vocab,
        num_features=args.features,
        block_size=args.block_size,
        mask_token_id=args.vocab - 1,
        init_std=0.02,
    )
    frozen = torch.randn(2, args.vocab, args.hidden, dtype=dtype, device=device) * 0.02
    return cfg, build_drafter(cfg, frozen[0], frozen[1], device, seed=0)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=3072)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument(
        "--unfolded-clip",
        action="store_true",
        help="clip_grad_norm_ then step (a pass of its own), the baseline of dflash/optimizer.py",
    )
    p.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="then profile N more steps and print the kernels that took the most GPU time",
    )  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200)")
    p.add_argument(
        "--cpu", action="store_true",
        help="run on the CPU (give it a small shape: a rehearsal of the script, not a figure)",
    )  # fmt: skip
    return p.parse_args()


def model_flops(cfg: DrafterConfig, rows: int, seq_len: int, anchors: torch.Tensor) -> dict:
    """Useful FLOPs of one training step, by part."""
    h, d, b = cfg.hidden_size, cfg.head_dim, cfg.block_size
    queries = anchors.numel() * b
    keys = rows * seq_len + queries
    proj = 2 * queries * h * cfg.num_heads * d * 2 + 2 * keys * h * cfg.num_kv_heads * d * 2
    mlp = 2 * queries * h * cfg.intermediate_size * 3
    visible = float((anchors.float() + b).sum()) * b  # keys seen, summed over queries
    attention = 4 * visible * cfg.num_heads * d
    layers = 3 * cfg.num_layers * (proj + mlp + attention)
    fc = 2 * 2 * rows * seq_len * cfg.num_features * h * h
    lm_head = 2 * 2 * anchors.numel() * (b - 1) * h * cfg.vocab_size
    return {"layers": layers, "fc": fc, "lm_head": lm_head}


def main() -> None:
    args = parse()
    device = torch.device("cpu" if args.cpu else "cuda:0")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    cfg, drafter = shaped_drafter(args, device, dtype)
    step = DrafterStep(drafter, gamma=7.0, num_anchors=args.anchors, compile=args.compile)
    optimizer = torch.optim.AdamW(
        drafter.parameters(), lr=1e-4, weight_decay=0.0, fused=not args.cpu
    )
    rows, seq = args.rows, args.seq_len
    batch = FeatureBatch(
        input_ids=torch.randint(0, args.vocab - 1, (rows, seq), device=device),
        loss_mask=torch.ones(rows, seq, dtype=torch.bool, device=device),
        features=torch.randn(rows, seq, args.features * args.hidden, dtype=dtype, device=device),
        num_tokens=rows * seq,
    )

    trainable = list(drafter.parameters())

    def train_step(i: int) -> None:
        loss = step.loss(batch, torch.Generator().manual_seed(i))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.unfolded_clip:  # the step before dflash/optimizer.py: clipping's own pass
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
        else:  # the trainer's (dflash.trainer.Trainer)
            clip_and_step(optimizer, trainable, 1.0)

    times = []
    began = time.perf_counter()
    for i in range(args.warmup_steps + args.steps):
        seconds = timed(lambda i=i: train_step(i), device)
        if i == 0:
            first_step_s = time.perf_counter() - began  # compilation included
            if args.compile:
                print(compile_report(), file=sys.stderr, flush=True)
        print(f"step {i}: {seconds:.4f} s", file=sys.stderr, flush=True)
        if i >= args.warmup_steps:
            times.append(seconds)

    # Anchors as the step samples them: every position is in the loss, so every slot is kept.
    anchors, _ = sample_anchors(batch.loss_mask, args.anchors, torch.Generator(), fixed=True)
    flops = model_flops(cfg, rows, seq, anchors)
    total = sum(flops.values())
    step_s = statistics.median(times)
    achieved = total / step_s / 1e12
    params = sum(p.numel() for p in drafter.parameters())
    print(
        f"| shape | {args.layers} layers, hidden {args.hidden}, B {args.block_size}, "
        f"{args.anchors} anchors, seq {seq} x {rows}, {params / 1e9:.2f}B trainable |"
    )
    print("| --- | --- |")
    for part, value in flops.items():
        print(f"| TFLOP {part} | {value / 1e12:.2f} |")
    print(f"| TFLOP total | {total / 1e12:.2f} |")
    print(f"| compile | {args.compile} |")
    print(f"| step s (median of {args.steps}) | {step_s:.4f} (min {min(times):.4f}) |")
    print(f"| achieved TFLOP/s | {achieved:.0f} |")
    print(f"| MFU vs {args.peak_tflops:.0f} TFLOP/s | {100 * achieved / args.peak_tflops:.1f}% |")
    if not args.cpu:
        print(f"| peak memory GiB | {torch.cuda.max_memory_allocated() / 2**30:.1f} |")
    print(f"| first step s (wall, compilation included) | {first_step_s:.1f} |")
    if args.profile and not args.cpu:
        profile(train_step, args.profile, step_s)


def timed(fn: Callable[[], None], device: torch.device) -> float:
    """Seconds of `fn` on the device (CUDA events), or wall seconds on the CPU."""
    if device.type != "cuda":
        began = time.perf_counter()
        fn()
        return time.perf_counter() - began
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def compile_report() -> str:
    """Where the first step's compilation went: each graph Dynamo compiled, in order, with its
    seconds (a backward graph's count only Inductor's)."""
    from torch._dynamo.utils import get_compilation_metrics

    graphs = "\n".join(
        f"  {m.compile_id} {m.co_name} ({Path(m.co_filename or '?').name}): "
        f"{'forward' if m.is_forward else 'backward'} "
        f"{m.entire_frame_compile_time_s or 0:.1f} s whole, "
        f"inductor {m.inductor_compile_time_s or 0:.1f} s"
        for m in get_compilation_metrics()
    )
    return f"graphs compiled, in order:\n{graphs}"


def profile(train_step: Callable[[int], None], steps: int, step_s: float) -> None:
    """The kernels that took the most GPU time over `steps` steps, each as a share of a step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            train_step(1000 + i)
        torch.cuda.synchronize()
    kernels = sorted(prof.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in kernels) / 1e6 / steps
    print("\n| kernel (top 25) | ms per step | share of GPU time | calls per step |")
    print("| --- | --- | --- | --- |")
    for event in kernels[:25]:
        ms = event.self_device_time_total / 1e3 / steps
        print(f"| {event.key[:90]} | {ms:.2f} | {ms / 1e3 / total:.1%} | {event.count // steps} |")
    print(f"| all kernels | {total * 1e3:.1f} (the step: {step_s * 1e3:.1f}) | | |")
    print_gaps(prof, steps)


def print_gaps(prof: Any, steps: int) -> None:
    """The GPU's idle spans between kernels (the host not keeping the queue full), largest
    first, with the kernels on either side."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    gaps, busy_until, before = [], None, ""
    for start, end, name in spans:
        if busy_until is not None and start > busy_until:
            gaps.append((start - busy_until, before, name))
        if busy_until is None or end > busy_until:
            busy_until, before = end, name
    gaps.sort(reverse=True)
    print(f"\nGPU idle between kernels: {sum(g[0] for g in gaps) / 1e3 / steps:.2f} ms a step "
          f"in {len(gaps) // steps} gaps a step; the largest (ms, after -> before):")  # fmt: skip
    for us, after, before_next in gaps[:12]:
        print(f"  {us / 1e3:.3f}  {after[:60]} -> {before_next[:60]}")


if __name__ == "__main__":
    main()
