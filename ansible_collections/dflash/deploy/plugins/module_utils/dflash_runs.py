# The trainer's runs under a state root: trainer.json (which run the launcher started, and
# how it was stopped), a new run's folder and id, runs/latest, and starting run.sh detached
# from the module that starts it. Standard library only.
from __future__ import annotations

import contextlib
import os
import subprocess
from datetime import UTC, datetime

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import ROOT_MARKER
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    RUNS,
    STATUS,
    TMP_PREFIX,
    TRAIN_LOG,
    read_json,
    run_path,
    write_json_atomic,
)

TRAINER_FILE = "trainer.json"
# What a trainer (run.sh) and the warmup keep of the environment of the module that starts
# them; run.sh exports the rest itself.
KEPT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def trainer_record(root: str, processes: list[dict]) -> tuple[dict | None, str | None]:
    """Which run the launcher started: trainer.json, a cache of the copy in the run's own folder.
    When it is missing, torn or names no trainer of this root while exactly one trainer runs,
    that trainer's own copy (runs/<its run id>/trainer.json) is the record, with a sentence
    saying what was wrong with trainer.json (else None)."""
    path = os.path.join(root, TRAINER_FILE)
    record = read_json(path)
    record = record if isinstance(record, dict) else None
    jobs = {proc["job"] for proc in processes}
    if len(jobs) != 1 or (record and record.get("pid") in jobs):
        return record, None
    job = jobs.pop()
    run_id = next((p.get("run_id") for p in processes if p["pid"] == job), None)
    own = read_json(run_path(root, run_id, TRAINER_FILE)) if run_id else None
    # The copy names its run's supervisor; a trainer that outlived it (the supervisor killed)
    # is still that run's, and with trainer.json lost the copy is the only record of it.
    if not isinstance(own, dict) or (
        own.get("pid") != job and (record or own.get("run_id") != run_id)
    ):
        return record, None
    if record:
        wrong = f"names pid {record.get('pid')}, which is no trainer of this root"
    else:
        wrong = "is missing" if not os.path.exists(path) else "is not a JSON record"
    return own, (
        f"{path} {wrong}; the trainer that runs is pid {job} (run {run_id}), as "
        f"{run_path(root, run_id, TRAINER_FILE)} says"
    )


def write_trainer_record(root: str, record: dict) -> None:
    """trainer.json, and its copy in the run's folder, from which a lost one is rebuilt."""
    write_json_atomic(run_path(root, record["run_id"], TRAINER_FILE), record)
    write_json_atomic(os.path.join(root, TRAINER_FILE), record)


def recorded_status(root: str, record: dict | None) -> dict:
    """The status.json of the run `record` (trainer_record) names ({} without one)."""
    run_id = (record or {}).get("run_id")
    return (read_json(run_path(root, run_id, STATUS)) or {}) if run_id else {}


def new_run_id(release: str) -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{release}"


def point_latest(root: str, run_id: str) -> None:
    tmp = os.path.join(root, RUNS, f"{TMP_PREFIX}latest-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(run_id, tmp)
    os.replace(tmp, os.path.join(root, RUNS, "latest"))


def launch_env(**extra: str) -> dict[str, str]:
    """The environment the trainer and the compile warmup start in: KEPT_ENV from this module's
    own, then `extra`; nothing else of the caller's. One environment for both, because
    Inductor's cache keys read environment variables (TORCHINDUCTOR_*, CXX, ...): a warmup that
    saw a variable the trainer does not see compiles graphs the trainer never finds."""
    return {**{name: os.environ.get(name, default) for name, default in KEPT_ENV.items()}, **extra}


def start_run(root: str, release: str, run_sh: str) -> tuple[subprocess.Popen, str, str]:
    """Start run.sh detached, in a new run folder (runs/<run id>, and runs/latest to it), its
    output into the run's train.log; the process, the run id and the log's path."""
    run_id = new_run_id(release)
    run_dir = os.path.join(root, RUNS, run_id)
    os.makedirs(run_dir)
    log_path = os.path.join(run_dir, TRAIN_LOG)
    env = launch_env(DFLASH_RUN_ID=run_id, **{ROOT_MARKER: os.path.realpath(root)})
    with open(log_path, "xb") as log:
        proc = subprocess.Popen(
            ["/bin/bash", run_sh], cwd=root, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )  # fmt: skip
    point_latest(root, run_id)
    return proc, run_id, log_path
