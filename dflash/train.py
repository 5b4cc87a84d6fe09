"""python -m dflash.train: train a DFlash drafter with status.json, checkpoints and safe stop.

SIGTERM or SIGINT: the current step finishes, a checkpoint is saved, status.json says
"stopped", exit 0. On start, training resumes from the newest complete checkpoint.

One process (CPU, one GPU) or one torchrun rank per GPU (`dflash.topology`): the drafter
ranks agree after every step whether to go on, so all stop after the same step; only the lead
drafter rank writes status.json, checkpoints and the step lines of the log.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dflash import checkpoint
from dflash.assemble import build_server, build_trainer
from dflash.cluster import Cluster, job_fields, torchrun_rank
from dflash.errors import ConfigError
from dflash.flags import train_parser
from dflash.model import DrafterConfig
from dflash.options import drafter_differences
from dflash.provenance import code_tree_sha256, header_lines, release_name
from dflash.public_format import PublicDrafter, is_drafter_folder, read_folder, target_problems
from dflash.stages import StageWindow, stage_text
from dflash.status import StatusFile, utc_now
from dflash.target import load_target_config
from dflash.topology import Layout, plan_layout, resolve_roles
from dflash.trainer import Trainer


def log(message: str) -> None:
    print(f"{utc_now()} {message}", flush=True)


def rank_log(cluster: Cluster) -> Callable[[str], None]:
    """The lead logs plainly; the first target rank of split mode with its rank in front (its
    target and data lines); the other ranks keep quiet."""
    if cluster.rank == cluster.layout.lead:
        return log
    if cluster.me.target and cluster.rank == 0:
        return lambda message: log(f"[rank {cluster.rank}] {message}")
    return lambda message: None


def resume_plan(folder: Path, cfg: DrafterConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The lead's look at the checkpoint folder: where every rank starts (the checkpoint's path
    and data order), and the checkpoint itself."""
    found = checkpoint.load_latest(folder, warn=lambda message: log(f"warning: {message}"))
    if found is None:
        log(f"no checkpoint in {folder}: starting at step 0")
        return {"path": None, "data": None}, {}
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
    return {"path": str(path), "data": payload["data"]}, payload


def init_plan(folder: Path, cfg: DrafterConfig, target_model: str) -> PublicDrafter:
    """--init-from's drafter, refused unless it is the drafter these flags build."""
    if not is_drafter_folder(folder):
        raise ConfigError(f"--init-from '{folder}': not a folder holding a DFlash config.json")
    drafter = read_folder(folder)
    problems = target_problems(drafter, load_target_config(target_model), target_model)
    problems += drafter_differences(drafter.cfg, cfg)
    if problems:
        raise ConfigError(f"--init-from '{folder}': {'; '.join(problems)}")
    return drafter


def checkpoint_holder(cluster: Cluster, folder: Path) -> int:
    """The rank that plans the start: the lead, or in a job over several nodes the reporting
    rank of the node with the newest checkpoint (torchrun's c10d rendezvous numbers the nodes
    itself, so the lead that saved the last checkpoint may be on another node now)."""
    layout = cluster.layout
    if layout.nnodes == 1:
        return layout.lead
    steps = cluster.gather(checkpoint.newest_step(folder) if layout.reports(cluster.rank) else None)
    found = [(step, -rank) for rank, step in enumerate(steps) if step is not None]
    return -max(found)[1] if found else layout.lead


def shared_plan(
    cluster: Cluster, holder: int, plan: Callable[[], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The holder's `plan()` on every rank; a refusal there stops every rank with its message."""
    mine: dict[str, Any] | None = None
    if plan is not None and cluster.rank == holder:
        try:
            mine = plan()
        except ConfigError as exc:
            mine = {"error": str(exc)}
    shared = cluster.share(mine, src=holder)
    if "error" in shared:
        raise ConfigError(shared["error"])
    return shared


def resume(
    trainer: Trainer,
    cfg: DrafterConfig,
    cluster: Cluster,
    args: argparse.Namespace,
    status: StatusFile,
) -> int:
    """Every drafter rank loads the lead's newest complete checkpoint; returns its step."""
    lead = cluster.rank == cluster.layout.lead
    loaded: dict[str, Any] = {}

    def plan() -> dict[str, Any]:
        where, payload = resume_plan(Path(args.checkpoint_dir), cfg)
        loaded.update(payload)
        if args.init_from and where["path"] is not None:
            log(f"--init-from {args.init_from} not used: resuming from {where['path']}")
        elif args.init_from:
            loaded["init"] = init_plan(Path(args.init_from), cfg, args.target_model)
            where["init_from"] = args.init_from
        return where

    holder = checkpoint_holder(cluster, Path(args.checkpoint_dir))
    where = shared_plan(cluster, holder, plan)
    if where["path"] is None:
        if where.get("init_from"):
            initial = loaded.get("init") or read_folder(Path(where["init_from"]))
            trainer.drafter.load_state_dict(initial.state)
            if lead:
                log(f"initialised the drafter from {where['init_from']}")
        return 0
    path = Path(where["path"])
    if cluster.layout.nnodes > 1:  # the other nodes do not have the holder's checkpoint folder
        payload = cluster.share_drafters(loaded or None, src=holder)
    else:
        payload = loaded or torch.load(path, map_location="cpu", weights_only=True)
    if trainer.load_state_dict(payload["step"], payload):
        status.update(data_order="resumed")
    else:
        note = data_order_note(payload.get("data") or {}, trainer.source.data)
        status.update(data_order=note)
        if lead:
            log(f"warning: {note}")
    # resumed_from_step: a deploy's health check counts the steps of this run from there.
    status.update(
        step=trainer.step,
        resumed_from_step=trainer.step,
        checkpoint={"path": str(path), "step": trainer.step},
    )
    if lead:
        log(f"resumed from {path} at step {trainer.step}")
    return trainer.step


def data_order_note(saved: dict[str, Any], data: dict[str, Any]) -> str:
    """Why a resumed run starts a new data order (it keeps the weights)."""
    before = str(saved.get("data_sha256") or "unknown")[:12]
    now = str(data.get("content_sha256"))[:12]
    if before != now:
        why = f"the data differ from the checkpoint's (sha256 {before} -> {now})"
    else:
        counts = f"{saved.get('num_samples')} -> {data.get('samples_in_order')}"
        why = f"the samples the order takes at this --max-seq-len differ ({counts})"
    return f"new data order: {why}; the weights are resumed, the order starts at epoch 0"


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
        "training_data": {**trainer.source.data, "seed": args.seed},
    }
    path = checkpoint.save(folder, trainer.step, {**trainer.state_dict(), **extra})
    checkpoint.prune(folder, args.keep_checkpoints)
    status.write(state=state_after, checkpoint={"path": str(path), "step": trainer.step})
    log(f"checkpoint {path}")


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

    @property
    def window(self) -> dict[str, int | None]:
        """status.json's `throughput_window`: the steps the figure covers and the window size;
        fewer steps than the size is an early figure (verify.yml does not judge it)."""
        return {"steps": len(self.steps), "size": self.steps.maxlen}


def train(args: argparse.Namespace, cluster: Cluster, status: StatusFile, stop: StopRequest) -> int:
    """A drafter rank (the only rank of a one-process run)."""
    lead = cluster.rank == cluster.layout.lead
    status.write(state="warming")  # loading, generating data, compiling: until the first step
    trainer, cfg = build_trainer(args, cluster, rank_log(cluster))
    status.update(data=trainer.source.data)
    folder = Path(args.checkpoint_dir)
    saved_step = resume(trainer, cfg, cluster, args, status)
    throughput = Throughput(args.throughput_window)
    stages = StageWindow(args.throughput_window)
    while True:
        done = cluster.agree_to_stop(stop.event.is_set() or trainer.step >= args.max_steps)
        trainer.source.credit(not done)
        if done:
            break
        result = trainer.train_step()
        loss, num_tokens = cluster.step_totals(result.loss, result.num_tokens)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {result.step}")
        tokens_per_s = throughput.add(num_tokens)  # the whole job's tokens: the same on every rank
        stages.add({**result.stages, "step": throughput.last_step_s})
        means = stages.means()
        status.update(
            step=result.step,
            loss=loss,
            tokens_per_s=round(tokens_per_s, 1),
            throughput_window=throughput.window,
            stages=means,
        )
        if status.enabled and status.snapshot()["state"] != "running":
            status.write(state="running")  # only now: a real optimizer step is done
        if not lead:
            continue
        if result.step % args.log_every == 0 or throughput.count == 1:
            log(
                f"step {result.step} loss {loss:.4f} tokens/s {tokens_per_s:.0f} "
                f"lr {result.lr:.3e} step_s {throughput.last_step_s:.3f} | {stage_text(means)}"
            )
        if result.step % args.checkpoint_every == 0:
            save_checkpoint(trainer, folder, cfg, args, status, "running")
            saved_step = trainer.step
        if args.sleep_per_step:
            stop.event.wait(args.sleep_per_step)
    trainer.source.close()
    if not lead:
        status.write(state="stopped")  # another node's status.json; the lead checkpoints
        return 0
    reason = stop.reason or (
        f"--max-steps {args.max_steps} reached"
        if trainer.step >= args.max_steps
        else "another rank was asked to stop"
    )
    if trainer.step != saved_step:
        save_checkpoint(trainer, folder, cfg, args, status, "stopped")
    else:
        status.write(state="stopped")
    log(f"stopped at step {trainer.step}: {reason}")
    return 0


def serve(args: argparse.Namespace, cluster: Cluster) -> int:
    """A target rank of split mode: features for its drafter ranks until they stop."""
    say = rank_log(cluster)
    server = build_server(args, cluster, say)
    # The holder decides where to start; target ranks follow.
    plan = shared_plan(cluster, checkpoint_holder(cluster, Path(args.checkpoint_dir)))
    if plan["data"] is not None and not server.order.load_state_dict(plan["data"]):
        say(f"warning: {data_order_note(plan['data'], server.order.data)}")
    steps = server.run()
    say(f"served {steps} steps to drafter ranks {server.drafters}")
    return 0


def describe(layout: Layout) -> str:
    """`2 (0: target cuda:0, 1: drafter cuda:1)` for the log header."""
    roles = []
    for r in layout.ranks:
        role = "target+drafter" if r.target and r.drafter else "target" if r.target else "drafter"
        roles.append(f"{r.rank}: {role} {r.device}")
    return f"{layout.world_size} ({', '.join(roles)})"


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
    args = train_parser().parse_args(argv)
    rank, world_size = torchrun_rank()
    # Until the layout names the reporters, each node's first process reports (a bad flag
    # fails every rank alike).
    first_on_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
    status = StatusFile(
        Path(args.status_file), args.run_id, args.status_interval, enabled=first_on_node
    )
    stop = StopRequest()
    try:
        roles = resolve_roles(args.target_gpus, args.drafter_gpus, check_gpus=not args.cpu_ranks)
        layout = plan_layout(roles, world_size, on_cpu=args.cpu_ranks)
        status.enabled = layout.reports(rank)
        status.write(state="starting", gpus=roles.as_dict(), job=job_fields(layout, rank))
        status.start_heartbeat()
        if status.enabled:  # every node's train.log says what runs there
            extra = {"mode": roles.mode, "ranks": describe(layout)}
            for line in header_lines(args.run_id, roles.as_dict(), extra):
                log(line)
        cluster = Cluster(layout, rank, args.dist_timeout)
        code = train(args, cluster, status, stop) if cluster.me.drafter else serve(args, cluster)
        cluster.close()
        return code
    except ConfigError as exc:
        log(f"{'' if status.enabled else f'[rank {rank}] '}error: {exc}")
        status.write(state="failed", error=str(exc))
        return 2
    except Exception as exc:
        if not status.enabled:
            log(f"[rank {rank}] failed:")
        traceback.print_exc(file=sys.stdout)
        status.write(state="failed", error=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        status.stop_heartbeat()


if __name__ == "__main__":
    sys.exit(main())
