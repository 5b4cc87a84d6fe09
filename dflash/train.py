"""python -m dflash.train: train a DFlash drafter with status.json, checkpoints and safe stop.

SIGTERM or SIGINT: the current step finishes, a checkpoint is saved, status.json says
"stopped", exit 0. On start, training resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import torch

from dflash import checkpoint
from dflash.data import BatchOrder, Sample, load_jsonl, self_generated
from dflash.errors import ConfigError
from dflash.model import DrafterConfig
from dflash.options import (
    add_drafter_args,
    add_gen_args,
    add_shape_args,
    add_target_args,
    build_drafter,
    drafter_config,
    fixed_rows,
    gamma,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    token_budget,
)
from dflash.pipeline import LocalFeatureSource
from dflash.provenance import code_tree_sha256, header_lines, release_name
from dflash.status import StatusFile, utc_now
from dflash.step import DrafterStep, static_shapes
from dflash.target import TINY, Target, load_target
from dflash.topology import Roles, device_of, resolve_roles
from dflash.trainer import Trainer


def log(message: str) -> None:
    print(f"{utc_now()} {message}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.train", description="Train a DFlash drafter for a frozen target."
    )
    add_target_args(parser)
    gpus = parser.add_argument_group("GPU roles (both empty: CPU)")
    gpus.add_argument(
        "--target-gpus", default="", help="GPUs running the target, e.g. 0-3 or 0,1 (default: none)"
    )
    gpus.add_argument(
        "--drafter-gpus",
        default="",
        help="GPUs training the drafter; equal to --target-gpus = colocated",
    )
    add_drafter_args(parser)
    add_shape_args(parser)
    parser.add_argument(
        "--compile-drafter",
        action="store_true",
        help="torch.compile the drafter step (static shapes)",
    )
    parser.add_argument(
        "--data", default=None, help="JSONL training data (default: the target's own continuations)"
    )
    add_gen_args(parser, samples=512)
    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--lr", type=positive_float, default=6e-4, help="peak AdamW lr")
    optim.add_argument(
        "--warmup-ratio",
        type=nonneg_float,
        default=0.04,
        help="share of --max-steps spent warming the lr up (default 0.04)",
    )
    optim.add_argument("--grad-clip", type=positive_float, default=1.0)
    optim.add_argument(
        "--max-steps",
        type=positive_int,
        default=100_000,
        help="stop (checkpoint, status stopped, exit 0) after this many steps; "
        "also the length of the cosine schedule",
    )
    optim.add_argument("--seed", type=nonneg_int, default=0)
    run = parser.add_argument_group("run")
    run.add_argument("--run-id", default=f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    run.add_argument("--checkpoint-dir", default="checkpoints")
    run.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=1000,
        help="steps between periodic checkpoints (default 1000)",
    )
    run.add_argument(
        "--keep-checkpoints",
        type=nonneg_int,
        default=0,
        help="delete all but the newest N checkpoints (default 0: keep all)",
    )
    run.add_argument("--status-file", default="status.json")
    run.add_argument(
        "--status-interval",
        type=positive_float,
        default=2.0,
        help="seconds between status.json heartbeats (default 2)",
    )
    run.add_argument(
        "--log-every", type=positive_int, default=10, help="steps between log lines (default 10)"
    )
    run.add_argument(
        "--sleep-per-step",
        type=nonneg_float,
        default=0.0,
        help="developer flag: sleep this long after each step (a slow release)",
    )
    return parser


def training_samples(args: argparse.Namespace, target: Target) -> list[Sample]:
    if args.data:
        tokenizer = args.tokenizer or (None if args.target_model == TINY else args.target_model)
        return load_jsonl(Path(args.data), tokenizer, target.config.vocab_size, args.max_seq_len)
    return self_generated(
        target,
        args.gen_samples,
        args.gen_prompt_len,
        args.gen_new_tokens,
        args.seed,
        "train",
        max_len=args.max_seq_len,
    )


def resume(trainer: Trainer, folder: Path, cfg: DrafterConfig, status: StatusFile) -> int:
    """Load the newest complete checkpoint; returns the step training starts from."""
    found = checkpoint.load_latest(folder, warn=lambda message: log(f"warning: {message}"))
    if found is None:
        log(f"no checkpoint in {folder}: starting at step 0")
        return 0
    path, payload = found
    saved, now = payload["drafter_config"], cfg.as_dict()
    if saved != now:
        diff = "; ".join(
            f"{key} {saved.get(key)!r} there, {value!r} now"
            for key, value in now.items()
            if saved.get(key) != value
        )
        raise ConfigError(
            f"--checkpoint-dir '{folder}': {path.name} is for another drafter ({diff}); "
            "use another --checkpoint-dir or the same settings"
        )
    if not trainer.load_state_dict(payload["step"], payload):
        log("warning: the data differ from the checkpoint's; the data order starts over")
    # resumed_from_step: a deploy's health check counts the steps of this run from there.
    status.update(
        step=trainer.step,
        resumed_from_step=trainer.step,
        checkpoint={"path": str(path), "step": trainer.step},
    )
    log(f"resumed from {path} at step {trainer.step}")
    return trainer.step


def save_checkpoint(
    trainer: Trainer,
    folder: Path,
    cfg: DrafterConfig,
    args: argparse.Namespace,
    status: StatusFile,
    state_after: str,
) -> None:
    status.write(state="checkpointing")
    extra: dict[str, Any] = {
        "drafter_config": cfg.as_dict(),
        "target_model": args.target_model,
        "run_id": args.run_id,
        "release": release_name(),
        "code_tree_sha256": code_tree_sha256(),
    }
    path = checkpoint.save(folder, trainer.step, {**trainer.state_dict(), **extra})
    checkpoint.prune(folder, args.keep_checkpoints)
    status.write(state=state_after, checkpoint={"path": str(path), "step": trainer.step})
    log(f"checkpoint {path}")


def build_trainer(args: argparse.Namespace, roles: Roles) -> tuple[Trainer, DrafterConfig]:
    """Target, drafter, data and optimizer on the devices of this process's roles."""
    target_device, device = device_of(roles.target), device_of(roles.drafter)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    rows = fixed_rows(args, on_gpu) if static_shapes(device, args.compile_drafter) else None
    budget = token_budget(args, on_gpu)
    target = load_target(
        args.target_model, target_device, args.num_target_layers, args.mask_token_id
    )
    cfg = drafter_config(args, target.config, target.mask_token_id)
    drafter = build_drafter(cfg, target.embed_weight(), target.lm_head_weight(), device, args.seed)
    trainable = sum(p.numel() for p in drafter.parameters())
    log(
        f"target {args.target_model}: {target.config.num_hidden_layers} layers, hidden "
        f"{cfg.hidden_size}, features from layers {target.layer_ids}, mask id {cfg.mask_token_id}"
    )
    log(
        f"drafter: {cfg.num_layers} layers, {trainable / 1e6:.2f}M trainable parameters, "
        f"block {cfg.block_size}, {args.num_anchors} anchors, token budget {budget}, "
        f"compile {args.compile_drafter}"
    )
    samples = training_samples(args, target)
    log(f"data: {len(samples)} samples from {args.data or 'the target (self-generated)'}")
    order = BatchOrder(
        samples, budget, pad_to=args.max_seq_len if rows else 8, fixed_rows=rows, seed=args.seed
    )
    step_fn = DrafterStep(drafter, gamma(args), args.num_anchors, compile=args.compile_drafter)
    trainer = Trainer(
        drafter,
        LocalFeatureSource(target, order, device),
        step_fn,
        lr=args.lr,
        max_steps=args.max_steps,
        warmup_ratio=args.warmup_ratio,
        grad_clip=args.grad_clip,
        seed=args.seed,
    )
    return trainer, cfg


class Throughput:
    """Tokens per second over the last few steps, sleeps and data included (end to end).

    The first step (lazy init, compilation) counts only until the second one is done, so the
    health gate of a deploy compares steady-state speed, not compile time."""

    def __init__(self, window: int = 20) -> None:
        self.steps: deque[tuple[float, int]] = deque(maxlen=window)
        self.last = time.monotonic()
        self.count = 0

    def add(self, num_tokens: int) -> float:
        now = time.monotonic()
        self.steps.append((now - self.last, num_tokens))
        self.last = now
        self.count += 1
        if self.count == 2:
            self.steps.popleft()
        return sum(n for _, n in self.steps) / max(1e-9, sum(dt for dt, _ in self.steps))

    @property
    def last_step_s(self) -> float:
        return self.steps[-1][0]


def run(args: argparse.Namespace, roles: Roles, status: StatusFile, stop: StopRequest) -> int:
    status.write(state="warming")  # loading, generating data, compiling: until the first step
    trainer, cfg = build_trainer(args, roles)
    folder = Path(args.checkpoint_dir)
    saved_step = resume(trainer, folder, cfg, status)
    throughput = Throughput()
    while trainer.step < args.max_steps and not stop.event.is_set():
        result = trainer.train_step()
        if not math.isfinite(result.loss):
            raise FloatingPointError(f"loss is {result.loss} at step {result.step}")
        tokens_per_s = throughput.add(result.num_tokens)
        status.update(step=result.step, loss=result.loss, tokens_per_s=round(tokens_per_s, 1))
        if status.snapshot()["state"] != "running":
            status.write(state="running")  # only now: a real optimizer step is done
        if result.step % args.log_every == 0 or len(throughput.steps) == 1:
            log(
                f"step {result.step} loss {result.loss:.4f} tokens/s {tokens_per_s:.0f} "
                f"lr {result.lr:.3e} step_s {throughput.last_step_s:.3f}"
            )
        if result.step % args.checkpoint_every == 0:
            save_checkpoint(trainer, folder, cfg, args, status, "running")
            saved_step = trainer.step
        if args.sleep_per_step:
            stop.event.wait(args.sleep_per_step)

    reason = stop.reason or f"--max-steps {args.max_steps} reached"
    if trainer.step != saved_step:
        save_checkpoint(trainer, folder, cfg, args, status, "stopped")
    else:
        status.write(state="stopped")
    log(f"stopped at step {trainer.step}: {reason}")
    return 0


class StopRequest:
    """SIGTERM/SIGINT set a flag that the loop reads between steps: a step is never cut."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.reason = self.reason or f"{signal.Signals(signum).name} received"
        self.event.set()


def main(argv: list[str] | None = None) -> int:
    code_tree_sha256()  # hash the code first: that is the code this process holds
    args = build_parser().parse_args(argv)
    status = StatusFile(Path(args.status_file), args.run_id, args.status_interval)
    stop = StopRequest()
    try:
        roles = resolve_roles(args.target_gpus, args.drafter_gpus)
        status.write(state="starting", gpus=roles.as_dict())
        status.start_heartbeat()
        for line in header_lines(args.run_id, roles.as_dict(), {"mode": roles.mode}):
            log(line)
        return run(args, roles, status, stop)
    except ConfigError as exc:
        log(f"error: {exc}")
        status.write(state="failed", error=str(exc))
        return 2
    except Exception as exc:
        traceback.print_exc(file=sys.stdout)
        status.write(state="failed", error=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        status.stop_heartbeat()


if __name__ == "__main__":
    sys.exit(main())
