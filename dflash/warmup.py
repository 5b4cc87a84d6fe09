"""python -m dflash.warmup: fill the compile caches (TorchInductor, Triton) before training.

Runs the drafter step (forward and backward) with the shapes and flags of training on each
drafter GPU, one after the other in this one process: torch.compile, create_block_mask and
the Triton autotuner are not thread-safe, so no two compilations ever race. Pass the same
shape and drafter flags as to `dflash.train` (and --compile-drafter if training uses it), so
the compiled graphs are the ones training will look up. Only the target's config is read;
frozen weights are random stand-ins of the right shape and dtype. Point
TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR where the trainer will look. Prints one JSON line
per device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from dflash.config import StepConfig
from dflash.errors import ConfigError
from dflash.flags import add_drafter_args, add_shape_args, positive_int
from dflash.options import build_drafter, drafter_config, fixed_rows, gamma
from dflash.pipeline import FeatureBatch
from dflash.step import DrafterStep
from dflash.target import load_target_config
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
    add_drafter_args(parser)
    add_shape_args(parser)
    return parser


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm(device: torch.device, config: StepConfig, target_config: Any) -> dict[str, Any]:
    """Run the compiled drafter step twice: the first compiles, the second shows the warm time."""
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if on_gpu else torch.float32  # the target's dtype in training
    cfg = drafter_config(config, target_config, mask_token_id=0)  # ids do not change the graph
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    embed = torch.randn(vocab, hidden, dtype=dtype, device=device)
    tied = getattr(target_config, "tie_word_embeddings", False)
    lm_head = embed if tied else torch.randn(vocab, hidden, dtype=dtype, device=device)
    drafter = build_drafter(cfg, embed, lm_head, device, seed=0)
    step = DrafterStep(drafter, gamma(config), config.num_anchors, compile=config.compile_drafter)
    rows, seq_len = fixed_rows(config, on_gpu), config.max_seq_len
    batch = FeatureBatch(
        input_ids=torch.randint(0, vocab, (rows, seq_len), device=device),
        loss_mask=torch.ones(rows, seq_len, dtype=torch.bool, device=device),
        features=torch.randn(rows, seq_len, cfg.num_features * hidden, dtype=dtype, device=device),
        num_tokens=rows * seq_len,
    )
    times = []
    for attempt in range(2):
        start = time.perf_counter()
        step.loss(batch, torch.Generator().manual_seed(attempt)).backward()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {
        "device": str(device),
        "first_step_s": round(times[0], 3),
        "warm_step_s": round(times[1], 3),
    }


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
        for device in devices:  # strictly one after the other
            print(json.dumps(warm(device, config, target_config)), flush=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
