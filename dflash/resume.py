"""Where a run starts, and the checkpoints it starts from.

One rank, the holder, looks at the checkpoint folder and plans the start: its newest complete
checkpoint, else --init-from's drafter, else step 0. Every rank follows that plan, so all start
from the same step and data position. The checkpoint files themselves are dflash.checkpoint's;
this module decides what goes in them and what a resume makes of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dflash import checkpoint
from dflash.checkpoint_names import newest_step
from dflash.cluster import Cluster
from dflash.config import TrainConfig
from dflash.data.order import ShardedOrder
from dflash.errors import ConfigError
from dflash.model import DrafterConfig
from dflash.options import drafter_differences
from dflash.provenance import code_tree_sha256, release_name
from dflash.public_format import PublicDrafter, is_drafter_folder, read_folder, target_problems
from dflash.supervision.status import StatusFile, utc_now
from dflash.target import load_target_config
from dflash.trainer import Trainer

Log = Callable[[str], None]


def resume(
    trainer: Trainer, config: TrainConfig, cluster: Cluster, status: StatusFile, log: Log
) -> int:
    """Every drafter rank starts where the holder's plan says; returns that step."""
    lead = cluster.rank == cluster.layout.lead
    cfg = trainer.drafter.cfg
    loaded: dict[str, Any] = {}  # what the holder read while planning, so it reads it once

    def plan() -> dict[str, Any]:
        remove_unfinished(config.checkpoint_dir, status, log)
        skipped: list[dict[str, Any]] = []
        where, payload = resume_plan(config.checkpoint_dir, cfg, log, skipped)
        if skipped:  # files left in place that a resume never uses: the user decides
            status.update(checkpoint_skipped=skipped)
        loaded.update(payload)
        if config.init_from and where["path"] is not None:
            log(f"--init-from {config.init_from} not used: resuming from {where['path']}")
        elif config.init_from:
            loaded["init"] = init_plan(Path(config.init_from), cfg, config.target_model)
            where["init_from"] = config.init_from
        return where

    holder = checkpoint_holder(cluster, config.checkpoint_dir)
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
        # The other ranks of the host map the same file: its pages are read once per host.
        payload = loaded or torch.load(path, map_location="cpu", weights_only=True, mmap=True)
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


def resume_order(order: ShardedOrder, folder: Path, cluster: Cluster, log: Log) -> None:
    """A target rank of split mode follows the holder's plan: only its data order resumes."""
    plan = shared_plan(cluster, checkpoint_holder(cluster, folder))
    if plan["data"] is not None and not order.load_state_dict(plan["data"]):
        log(f"warning: {data_order_note(plan['data'], order.data)}")


def save_checkpoint(
    trainer: Trainer, config: TrainConfig, status: StatusFile, state_after: str, log: Log
) -> bool:
    """The trainer's state and what a resume checks against: the drafter (a resume with other
    model settings is refused), the data (another order starts anew) and the provenance.
    Whether it was saved: a full disk loses this checkpoint, not the run (the next one may
    find room again)."""
    started = time.monotonic()
    # When this save began: the supervisor judges a stuck save by it (its own limit).
    status.write(state="checkpointing", checkpoint_started_at=utc_now())
    if config.sleep_in_checkpoint:
        time.sleep(config.sleep_in_checkpoint)
    extra: dict[str, Any] = {
        "drafter_config": trainer.drafter.cfg.as_dict(),
        "target_model": config.target_model,
        "run_id": config.run_id,
        "release": release_name(),
        "code_tree_sha256": code_tree_sha256(),
        "training_data": {**trainer.source.data, "seed": config.seed},
    }
    payload = {**trainer.state_dict(), **extra}
    try:
        path = checkpoint.save(config.checkpoint_dir, trainer.step, payload)
    except checkpoint.CheckpointWriteError as exc:
        not_saved(trainer.step, exc, config, status, state_after, log)
        status.write(
            state=state_after,
            checkpoint_seconds=seconds_spent(status, started),
            checkpoint_save_s=round(time.monotonic() - started, 3),
        )
        return False
    checkpoint.prune(config.checkpoint_dir, config.keep_checkpoints)
    status.write(
        state=state_after,
        checkpoint={"path": str(path), "step": trainer.step, "at": utc_now()},
        checkpoint_seconds=seconds_spent(status, started),
        checkpoint_save_s=round(time.monotonic() - started, 3),
    )
    log(f"checkpoint {path}")
    return True


def not_saved(
    step: int,
    exc: checkpoint.CheckpointWriteError,
    config: TrainConfig,
    status: StatusFile,
    state_after: str,
    log: Log,
) -> None:
    """Say in the log and status.json that the checkpoint of `step` was not written, and which
    one a restart would resume from."""
    last = status.snapshot()["checkpoint"]
    error = str(exc.strerror)
    goes_on = "training goes on, " if state_after == "running" else ""
    since = f"step {last['step']}" if last else "none (a restart starts at step 0)"
    log(
        f"warning: checkpoint at step {step} not saved: {error.lower()} "
        f"({config.checkpoint_dir}); {goes_on}the last checkpoint is {since}"
    )
    status.update(
        checkpoint_error={"step": step, "path": exc.filename, "error": error, "at": utc_now()}
    )


def seconds_spent(status: StatusFile, started: float) -> float:
    """status.json's checkpoint_seconds with this save's time (saved or not) added."""
    return round(status.snapshot()["checkpoint_seconds"] + time.monotonic() - started, 3)


def remove_unfinished(folder: Path, status: StatusFile, log: Log) -> None:
    """Temp files of writers killed mid-save only take space: removed, each named in the log
    and in status.json."""
    removed = checkpoint.remove_unfinished(folder)
    for path, pid in removed:
        log(f"removed {path}: a checkpoint left unfinished by a killed writer (pid {pid})")
    if removed:
        status.update(checkpoint_temp_removed=[str(path) for path, _ in removed])


def checkpoint_holder(cluster: Cluster, folder: Path) -> int:
    """The rank that plans the start: the lead, or in a job over several nodes the reporting
    rank of the node with the newest checkpoint (torchrun's c10d rendezvous numbers the nodes
    itself, so the lead that saved the last checkpoint may be on another node now)."""
    layout = cluster.layout
    if layout.nnodes == 1:
        return layout.lead
    steps = cluster.gather(newest_step(folder) if layout.reports(cluster.rank) else None)
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


def resume_plan(
    folder: Path, cfg: DrafterConfig, log: Log, skipped: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The holder's look at the checkpoint folder: where every rank starts (the checkpoint's
    path and data order), and the checkpoint itself; newer ones that cannot be used go into
    `skipped`."""
    # Mapped, not read: the tensors are read once, by load_state_dict's copies onto the device,
    # from the page cache the save left (a 12 GB checkpoint at the 8B shape).
    found = checkpoint.load_latest(
        folder, warn=lambda message: log(f"warning: {message}"), mmap=True, skipped=skipped
    )
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
