"""Proxmox tasks (UPIDs) for the doubles, kept the way a node keeps them.

A task is a worker process with a log file `tasks/<X>/<UPID>` (pve-common src/PVE/Tools.pm
`upid_encode`/`upid_decode`: X is the last hex digit of the start time). The UPID names the
worker's pid and start time; `/tasks/{upid}/status` says `running` while that process lives and
otherwise `stopped` with the exit status read from the log's last line (pve-manager
PVE/API2/Tasks.pm `read_task_status`, Tools.pm `upid_read_status`): `TASK OK` -> `OK`,
`TASK WARNINGS: N` -> `WARNINGS: N`, `TASK ERROR: msg` -> msg. A worker counts each `WARN:` line
it logs (src/PVE/RESTEnvironment.pm `warn`) and ends with one of those lines (`fork_worker`).

The API forks its workers (`spawn`: the UPID comes back at once, the work goes on); the CLI runs
them in the foreground (`run` in the calling process, as fork_worker does for the `cli` type).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .nodecfg import ENV_VAR, NodeConfig, fault, hold

UPID_RE = re.compile(
    r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
    r"([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$"
)


def _pstart(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def upid_encode(node: str, pid: int, pstart: int, starttime: int, kind: str, ident: str,
                user: str) -> str:  # fmt: skip
    return f"UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{kind}:{ident}:{user}:"


def upid_decode(upid: str) -> dict[str, object] | None:
    match = UPID_RE.match(upid)
    if not match:
        return None
    return {"node": match[1], "pid": int(match[3], 16), "pstart": int(match[4], 16),
            "starttime": int(match[5], 16), "type": match[6], "id": match[7],
            "user": match[8]}  # fmt: skip


def log_path(node: NodeConfig, upid: str) -> Path:
    starttime = upid.split(":")[4]
    return node.tasks / starttime[7] / upid


def read_exit_status(path: Path) -> str:
    """Tools.pm `upid_read_status`: the exit status from the log's last line."""
    try:
        lines = path.read_text(errors="replace").rstrip("\n").splitlines()
    except OSError as exc:
        return f"unable to open file - {exc.strerror}"
    last = lines[-1] if lines else ""
    if last == "TASK OK":
        return "OK"
    if match := re.match(r"^TASK ERROR: (.+)$", last):
        return match[1]
    if match := re.match(r"^TASK (WARNINGS: \d+)$", last):
        return match[1]
    return "unexpected status"


def status(node: NodeConfig, upid: str) -> dict[str, object] | None:
    """`GET /nodes/{node}/tasks/{upid}/status`, or None when there is no such task."""
    task = upid_decode(upid)
    if task is None or not log_path(node, upid).exists():
        return None
    user = str(task["user"])
    if "!" in user:  # Tasks.pm `$convert_token_task`
        task["user"], task["tokenid"] = user.split("!", 1)
    running = _pstart(int(task["pid"])) == task["pstart"]  # type: ignore[call-overload]
    task.update(upid=upid, status="running" if running else "stopped")
    if not running:
        task["exitstatus"] = read_exit_status(log_path(node, upid))
    return task


def log_lines(node: NodeConfig, upid: str, start: int = 0, limit: int = 50
              ) -> tuple[int, list[dict[str, object]]]:  # fmt: skip
    """Tools.pm `dump_logfile`: (total, [{n, t}]); limit 0 reads to the end."""
    text = log_path(node, upid).read_text(errors="replace")
    lines = text.splitlines()
    chosen = lines[start:] if limit == 0 else lines[start : start + limit]
    result = [{"n": start + i + 1, "t": line} for i, line in enumerate(chosen)]
    if not lines:
        return 1, [{"n": 1, "t": "no content"}]
    return len(lines), result


class TaskLog:
    """What a worker prints goes to its log (and, for the CLI, to stdout: RESTEnvironment.pm
    `$tee_worker`); `warn` is RESTEnvironment's, which counts."""

    def __init__(self, path: Path, echo: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("a", buffering=1)
        self.echo = echo
        self.warnings = 0

    def print(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines() or [""]:
            self.handle.write(line + "\n")
            if self.echo:
                sys.stdout.write(line + "\n")

    def warn(self, text: str) -> None:
        self.print(f"WARN: {text}")
        self.warnings += 1

    def finish(self, error: str | None) -> str:
        if error:
            final = f"TASK ERROR: {error}"
        elif self.warnings:
            final = f"TASK WARNINGS: {self.warnings}"
        else:
            final = "TASK OK"
        self.handle.write(final + "\n")
        self.handle.close()
        return final


def run(
    node: NodeConfig,
    kind: str,
    ident: str,
    user: str,
    work: Callable[[TaskLog], None],
    announce: Callable[[str], None] | None = None,
    echo: bool = False,
) -> tuple[str, str]:
    """Be the worker of a task in this process: (UPID, its final log line). A forked worker
    hands its UPID over (`announce`) before it starts the work."""
    pid = os.getpid()
    upid = upid_encode(node.node, pid, _pstart(pid) or 0, int(time.time()), kind, ident, user)
    log = TaskLog(log_path(node, upid), echo)
    if announce is not None:
        announce(upid)
    # Fault injection (bed.delay_tasks): the worker waits that long before it starts, read
    # again as it waits, so a test that sets 0 lets a held task go at once.
    hold(lambda: float(fault(node, "task_delay", {}).get(kind, 0)))  # type: ignore[attr-defined]
    error = None
    try:
        work(log)
    except Exception as exc:  # the worker's `die`: its last line ends the task
        lines = (str(exc).strip() or type(exc).__name__).splitlines()
        if lines[:-1]:
            log.print("\n".join(lines[:-1]))
        error = lines[-1]
    return upid, log.finish(error)


def worker_env(node: NodeConfig) -> dict[str, str]:
    """The environment of a process the node starts in the background (a task's worker, the HA
    stack's start): the bed's code importable, this node's config named."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
            ENV_VAR: str(Path(node.root) / "node.json")}  # fmt: skip


def spawn(node: NodeConfig, request: dict[str, object]) -> str:
    """Fork a worker (`python -m tests.testbed.node.worker`) and return its UPID at once."""
    env = worker_env(node)
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "tests.testbed.node.worker", json.dumps(request)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    with proc.stdout:
        upid = proc.stdout.readline().decode().strip()
    # Reap it when it ends, so that its pid stops counting as a running task.
    threading.Thread(target=proc.wait, daemon=True).start()
    if not UPID_RE.match(upid):
        raise RuntimeError(f"starting worker failed: {upid or 'no UPID'}")
    return upid
