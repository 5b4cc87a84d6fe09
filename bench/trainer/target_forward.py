"""The target's feature forward alone: eager against compiled decoder layers, and the SDPA
backend, at the Qwen3-8B shape (random weights, one row of 3072 tokens, 5 feature layers).

    python bench/trainer/target_forward.py [--modes eager,compiled,...] [--steps 10]
    python bench/trainer/target_forward.py --cpu   # the tiny target: a rehearsal of the script

Modes: `eager`, `compiled` (`Target.compile_layers`: one graph every decoder layer shares), and
either with `-cudnn` (cuDNN's attention first in SDPA's priority). Each compiled mode starts
from a reset Dynamo, so its first call compiles (Inductor's on-disk cache may still hit: point
TORCHINDUCTOR_CACHE_DIR at an empty folder for a cold figure). `--fp32-reference` compares each
mode's features, layer by layer, with an fp32 copy's eager forward. FLOPs are the matmuls and causal
attention of the layers the forward runs (up to the last feature layer), as
`pipeline.target_flops` counts them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # dflash from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from drafter_step import timed
from pipeline import FEATURES, SEQ, qwen3_8b_config, target_flops

from dflash.target import Target, feature_layer_ids, random_model, tiny_config

CUDNN_FIRST = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="eager,compiled,eager-cudnn,compiled-cudnn")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="the tiny target on the CPU (rehearsal)")
    p.add_argument(
        "--fp32-reference", action="store_true",
        help="compare each mode's features with an fp32 copy's eager forward (else the first's)",
    )  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200)")
    return p.parse_args()


def run_mode(mode: str, model: Any, layer_ids: list[int], ids: torch.Tensor, args: Any) -> dict:
    torch._dynamo.reset()
    target = Target("bench", model, layer_ids, mask_token_id=0)
    if mode.startswith("compiled"):
        target.compile_layers()
    backends = sdpa_kernel(CUDNN_FIRST, set_priority=True) if "cudnn" in mode else None
    with backends or contextlib.nullcontext():
        began = time.perf_counter()
        first = target.features(ids)
        if ids.is_cuda:
            torch.cuda.synchronize()
        first_s = time.perf_counter() - began
        times = [timed(lambda: target.features(ids), ids.device) for _ in range(args.warmup_steps)]
        times = [timed(lambda: target.features(ids), ids.device) for _ in range(args.steps)]
    return {"mode": mode, "first_s": first_s, "step_s": statistics.median(times),
            "min_s": min(times), "features": first}  # fmt: skip


def main() -> None:
    args = parse()
    device = torch.device("cpu" if args.cpu else "cuda:0")
    config = tiny_config() if args.cpu else qwen3_8b_config()
    seq = 64 if args.cpu else SEQ
    dtype = torch.float32 if args.cpu else torch.bfloat16
    began = time.perf_counter()
    model = random_model(config, device, dtype).eval().requires_grad_(False)
    print(f"target built in {time.perf_counter() - began:.1f} s", flush=True)
    layer_ids = feature_layer_ids(config.num_hidden_layers, 3 if args.cpu else FEATURES)
    ids = torch.randint(0, config.vocab_size - 1, (1, seq), device=device)
    run = layer_ids[-1] + 1
    flops = target_flops(config, seq, seq) * run / config.num_hidden_layers
    print(f"layers run {run} of {config.num_hidden_layers}, features {layer_ids}, "
          f"{flops / 1e12:.2f} TFLOP a forward")  # fmt: skip
    print("| mode | first call s | step s (median) | min s | MFU |")
    print("| --- | --- | --- | --- | --- |")
    features = {}
    for mode in args.modes.split(","):
        result = run_mode(mode, model, layer_ids, ids, args)
        features[mode] = result["features"]
        mfu = flops / result["step_s"] / (args.peak_tflops * 1e12)
        print(f"| {mode} | {result['first_s']:.1f} | {result['step_s']:.4f} | "
              f"{result['min_s']:.4f} | {mfu:.1%} |", flush=True)  # fmt: skip
    if device.type == "cuda":
        print(f"peak memory GiB {torch.cuda.max_memory_allocated() / 2**30:.1f}")
    if args.fp32_reference:
        with torch.device(device):
            reference = Target("fp32", copy.deepcopy(model).float(), layer_ids, 0).features(ids)
        name = "the fp32 eager forward of the same weights"
    else:
        name, reference = next(iter(features.items()))
    print(f"\nrelative L2 error of each feature layer {layer_ids} against {name}:")
    for mode, got in features.items():
        errors = [
            torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float())
            for a, b in zip(
                got.chunk(len(layer_ids), -1), reference.chunk(len(layer_ids), -1), strict=True
            )
        ]
        print(f"  {mode}: " + " / ".join(f"{e.item():.4f}" for e in errors))


if __name__ == "__main__":
    main()
