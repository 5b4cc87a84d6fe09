# Finding and stopping the trainers of one state root through /proc, so that a stray started
# by hand is found as surely as the one the launcher started.
from __future__ import annotations

import json
import os
import signal
import time

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import STATUS, run_path

ROOT_MARKER = "DFLASH_ROOT"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def ancestors() -> set[int]:
    """This process and its parents: never ours to stop."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            break
        pid = int(stat.rsplit(b")", 1)[1].split()[1])
    return pids


def process_info(pid: int) -> dict | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    if fields[0] == b"Z":  # exited, waiting for its parent: nothing left to stop
        return None
    environ = dict(
        item.split(b"=", 1) for item in (_read(f"/proc/{pid}/environ") or b"").split(b"\0")
        if b"=" in item
    )  # fmt: skip
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = ""
    return {
        "pid": pid,
        # R, S, D...; T: stopped (SIGSTOP), t: stopped by a tracer.
        "state": fields[0].decode(),
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "start_ticks": int(fields[19]),
        "cmdline": (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(
            errors="replace").strip(),
        "environ": environ,
        "cwd": cwd,
    }  # fmt: skip


def is_trainer_of(info: dict, root: str) -> bool:
    """Ours: marked by run.sh's environment, or a dflash.train running inside our releases."""
    root = os.path.realpath(root)
    if info["environ"].get(ROOT_MARKER.encode()) == root.encode():
        return True
    inside = info["cwd"] == root or info["cwd"].startswith(root + os.sep)
    return "dflash.train" in info["cmdline"] and inside


def find_trainers(root: str) -> list[dict]:
    skip = ancestors()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        info = process_info(int(name))
        if info and is_trainer_of(info, root):
            environ = info.pop("environ")
            info["run_id"] = environ.get(b"DFLASH_RUN_ID", b"").decode() or None
            info["cache_dir"] = environ.get(b"TORCHINDUCTOR_CACHE_DIR", b"").decode() or None
            found.append(info)
    return with_jobs(sorted(found, key=lambda item: item["pid"]))


def with_jobs(trainers: list[dict]) -> list[dict]:
    """Mark each process with its job: the pid of its topmost trainer ancestor. One trainer is
    one job, torchrun and its workers together (torchrun gives each worker its own session)."""
    parent = {info["pid"]: info["ppid"] for info in trainers}
    for info in trainers:
        job, seen = info["pid"], set()
        while parent.get(job) in parent and job not in seen:
            seen.add(job)
            job = parent[job]
        info["job"] = job
    return trainers


def jobs(trainers: list[dict]) -> list[int]:
    """The distinct trainers (their top process's pid)."""
    return sorted({info["job"] for info in trainers})


def alive(info: dict) -> bool:
    """Still the same process (a reused pid has another start time)."""
    now = process_info(info["pid"])
    return now is not None and now["start_ticks"] == info["start_ticks"]


def _signal(info: dict, sig: int) -> None:
    try:
        # A process group we made with setsid goes as a whole (torchrun and its workers); a
        # stray started from a shell shares the shell's group, so only the process itself.
        if info["pgid"] == info["pid"]:
            os.killpg(info["pgid"], sig)
        else:
            os.kill(info["pid"], sig)
    except ProcessLookupError:
        pass


def stopped(trainers: list[dict]) -> list[int]:
    """Pids of trainer processes that are stopped (SIGSTOP, a debugger): they train nothing."""
    return [info["pid"] for info in trainers if info.get("state") in ("T", "t")]


def _steps_since_checkpoint(root: str, info: dict) -> dict | None:
    """What the trainer of this process had done past its last checkpoint (its status.json)."""
    if not info.get("run_id"):
        return None
    try:
        with open(run_path(root, info["run_id"], STATUS), "rb") as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return None
    step = status.get("step") or 0
    saved = (status.get("checkpoint") or {}).get("step") or 0
    return {"pid": info["pid"], "step": step, "checkpoint_step": saved, "lost": step - saved}


def stop_all(trainers: list[dict], timeout: float, root: str | None = None) -> dict:
    """SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, wait up to `timeout` s,
    SIGKILL what is left; returns what happened to whom, and for each killed trainer the steps
    it had done past its last checkpoint (lost with it)."""
    for info in trainers:
        _signal(info, signal.SIGCONT)
        _signal(info, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(i) for i in trainers):
        time.sleep(0.1)
    killed = [i["pid"] for i in trainers if alive(i)]
    lost, runs = [], set()
    for info in trainers:  # one figure per run: torchrun's workers share their job's run id
        if root and info["pid"] in killed and info.get("run_id") not in runs:
            runs.add(info.get("run_id"))
            steps = _steps_since_checkpoint(root, info)
            if steps:
                lost.append(steps)
    for info in trainers:
        if alive(info):
            _signal(info, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(i) for i in trainers):
        time.sleep(0.05)
    return {
        "terminated": [i["pid"] for i in trainers if i["pid"] not in killed],
        "killed": killed,
        "lost_steps": lost,
        "survivors": [i["pid"] for i in trainers if alive(i)],
    }


def stop_summary(stopped_result: dict) -> str:
    """`stopped pid 9318 (SIGTERM)`, naming only what happened, and what a SIGKILL lost."""
    parts = []
    if stopped_result.get("terminated"):
        parts.append(f"pid {', '.join(map(str, stopped_result['terminated']))} stopped on SIGTERM")
    if stopped_result.get("killed"):
        parts.append(
            f"pid {', '.join(map(str, stopped_result['killed']))} killed (SIGKILL) after the "
            "stop timeout"
        )
    for item in stopped_result.get("lost_steps") or []:
        parts.append(
            f"pid {item['pid']} was at step {item['step']}, its last checkpoint at step "
            f"{item['checkpoint_step']}: {item['lost']} steps lost"
        )
    return "; ".join(parts)
