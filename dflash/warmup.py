"""python -m dflash.warmup: fill the compile caches (TorchInductor, Triton) before training.

Runs the drafter step (forward and backward) with the shapes and flags of training on each
drafter GPU, one after the other in this one process: torch.compile and the Triton autotuner
are not thread-safe, so no two compilations ever race. Pass the same shape and drafter flags
as to `dflash.train` (and --compile-drafter / --compile-target if training uses them), so
the compiled graphs are the ones training will look up. Only the target's config is read;
frozen weights are random stand-ins of the right shape and dtype. Point
TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR where the trainer will look. Prints one JSON line
per device: {device, first_step_s, warm_step_s, canary}, and with --compile-target
`target`: the target's compiled decoder layer, warmed on a one-layer stand-in of the target's
config (every layer of the real target runs that one graph) and checked against the same layer
uncompiled (relative L2 error of its output within the CUDA or CPU gradient bound).

The canary: the first compiled step (compiled now, or loaded from the cache) is run again
uncompiled, with the same weights, batch and anchor seed, and the two must agree within
`tolerance` (TOLERANCE), which the JSON line repeats:
- CPU: relative loss error <= 1e-3 and relative L2 error of the flattened gradients <= 1e-3.
  Both steps run in fp32 on the dense SDPA path; they differ by the order of float sums only
  (measured: ~1e-7).
- CUDA: relative loss error <= 1e-3, gradient error <= 5e-2. Both steps run in bf16 (autocast)
  with flex_attention, which is compiled in the uncompiled step too: the canary checks the
  compiled drafter step (--compile-drafter; without it both steps run the same code), not
  flex_attention's cached kernels, which both share. The dense SDPA path in fp32 would check
  those too, but it does not fit: at the Qwen3-8B drafter shape (5 layers, 3072 tokens, 512
  anchors) it asked for 24 GiB more with 118 GiB in use on an H200. Measured on an H200
  (torch 2.11): loss errors 1e-5 to 6e-5 and gradient errors 5e-3 (tiny target), 1.1e-2
  (Qwen3-8B width, 2 layers) and 2.0e-2 (the Qwen3-8B drafter shape, 28 GiB at peak); the
  gradient error grows with depth, so the bound leaves 2.5x at that shape.
A device whose canary fails is reported like the others; then the warmup exits with
CACHE_SUSPECT_EXIT (3): the cache it loaded or filled is suspect. A warmup whose canaries all
passed records the hashes of the files it compiled (dflash.cache_files).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Any

import torch
from torch import Tensor

from dflash.cache_files import record
from dflash.compile_watch import cache_dir
from dflash.config import StepConfig
from dflash.eager_reference import (
    TOLERANCE,
    canary,
    json_number,
    relative_error,
    run_step,
    synchronize,
    uncompiled,
)
from dflash.errors import ConfigError
from dflash.flags import add_drafter_args, add_shape_args, positive_int
from dflash.options import build_drafter, drafter_config, fixed_rows, gamma
from dflash.pipeline import FeatureBatch
from dflash.step import DrafterStep
from dflash.supervision.record import CACHE_SUSPECT_EXIT
from dflash.target import Target, load_target_config, random_model
from dflash.topology import parse_gpu_list, require_gpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.warmup",
        description="Compile the drafter step on each drafter GPU, one after the other.",
    )
    parser.add_argument("--target-model", default="tiny")
    parser.add_argument("--num-target-layers", type=positive_int, default=5)
    parser.add_argument(
        "--drafter-gpus", default="", help="GPUs to warm, e.g. 4-7 (default: the CPU)"
    )
    parser.add_argument(
        "--compile-drafter", action="store_true", help="as for training: compile the drafter"
    )
    parser.add_argument(
        "--compile-target",
        action="store_true",
        help="as for training: compile the target's decoder layers (one stand-in layer here)",
    )
    add_drafter_args(parser)
    add_shape_args(parser)
    return parser


def stand_in(vocab: int, hidden: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A frozen embedding or lm_head: random, at a trained model's scale (logits of order 1),
    so the canary compares well-conditioned numbers; the values do not change the graph."""
    return torch.randn(vocab, hidden, dtype=dtype, device=device) * hidden**-0.5


def warm(device: torch.device, config: StepConfig, target_config: Any) -> dict[str, Any]:
    """Run the compiled drafter step twice (the first compiles, the second shows the warm
    time), then the first once more eagerly: the canary."""
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if on_gpu else torch.float32  # the target's dtype in training
    cfg = drafter_config(config, target_config, mask_token_id=0)  # ids do not change the graph
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    embed = stand_in(vocab, hidden, dtype, device)
    tied = getattr(target_config, "tie_word_embeddings", False)
    lm_head = embed if tied else stand_in(vocab, hidden, dtype, device)
    drafter = build_drafter(cfg, embed, lm_head, device, seed=0)
    step = DrafterStep(drafter, gamma(config), config.num_anchors, compile=config.compile_drafter)
    rows, seq_len = fixed_rows(config, on_gpu), config.max_seq_len
    batch = FeatureBatch(
        input_ids=torch.randint(0, vocab, (rows, seq_len), device=device),
        loss_mask=torch.ones(rows, seq_len, dtype=torch.bool, device=device),
        features=torch.randn(rows, seq_len, cfg.num_features * hidden, dtype=dtype, device=device),
        num_tokens=rows * seq_len,
    )
    first = run_step(step, batch, seed=0)
    again = run_step(step, batch, seed=1)
    eager = run_step(uncompiled(step), batch, seed=0)
    return {
        "device": str(device),
        "first_step_s": round(first.seconds, 3),
        "warm_step_s": round(again.seconds, 3),
        "canary": canary(first, eager, device),
    }


def warm_target(device: torch.device, config: StepConfig, target_config: Any) -> dict[str, Any]:
    """The target's compiled decoder layer on the training batch's shape: seconds of its first
    call, and its output against the uncompiled layer's."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    one_layer = copy.deepcopy(target_config)
    one_layer.num_hidden_layers = 1  # the graph is one layer's, whichever layer runs it
    model = random_model(one_layer, device, dtype).eval().requires_grad_(False)
    target = Target(config.target_model, model, layer_ids=[0], mask_token_id=0)
    rows = fixed_rows(config, device.type == "cuda")
    ids = torch.randint(0, one_layer.vocab_size, (rows, config.max_seq_len), device=device)
    eager, _ = target.forward(ids)
    target.compile_layers()
    start = time.perf_counter()
    compiled, _ = target.forward(ids)
    synchronize(device)
    seconds = time.perf_counter() - start
    error = relative_error(compiled, eager)
    bound = TOLERANCE[device.type][1]
    return {
        "first_s": round(seconds, 3),
        "rel_err": json_number(error),
        "tolerance": bound,
        "ok": error <= bound,  # NaN is not ok
    }


def healthy(line: dict[str, Any]) -> bool:
    """Both canaries of a device's line passed (the target's where it was warmed)."""
    return line["canary"]["ok"] and line.get("target", {}).get("ok", True)


def suspect(line: dict[str, Any]) -> str:
    """What to do about a device whose canary failed."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(Inductor's default folder)")
    result, target = line["canary"], line.get("target")
    if result["ok"] and target is not None:
        what = (
            f"the compiled target layer disagrees with the eager one (relative error "
            f"{target['rel_err']}; tolerance {target['tolerance']})"
        )
    else:
        what = (
            f"the compiled drafter step disagrees with the eager one (relative loss error "
            f"{result['loss_rel_err']}, gradient error {result['grad_rel_err']}; tolerance "
            f"{result['tolerance']})"
        )
    return (
        f"error: on {line['device']} {what}: the compile cache {folder} is suspect; clear it "
        "(a deploy with -e dflash_compile_cache=clear) and warm again"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = StepConfig.from_args(args)
    try:
        gpus = parse_gpu_list("--drafter-gpus", args.drafter_gpus)
        require_gpus("--drafter-gpus", args.drafter_gpus, gpus)
        if not gpus and not config.compile_drafter:
            raise ConfigError(
                "--drafter-gpus '': on the CPU only --compile-drafter compiles anything; "
                "pass it, or name the GPUs to warm"
            )
        target_config = load_target_config(config.target_model)
        devices = [torch.device(f"cuda:{i}") for i in gpus] or [torch.device("cpu")]
        lines = []
        for device in devices:  # strictly one after the other
            line = warm(device, config, target_config)
            if config.compile_target:
                line["target"] = warm_target(device, config, target_config)
            lines.append(line)
            print(json.dumps(lines[-1]), flush=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [line for line in lines if not healthy(line)]
    for line in failed:
        print(suspect(line), file=sys.stderr)
    folder = cache_dir()
    if folder is not None and not failed:  # what it compiled, as it wrote it (dflash.cache_files)
        record(folder)
    return CACHE_SUSPECT_EXIT if failed else 0


if __name__ == "__main__":
    sys.exit(main())
