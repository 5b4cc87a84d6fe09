"""Process bookkeeping by pid: everything the test bed starts is stopped by its own pid.

A pid alone can be reused after its process ends, so each recorded process also keeps its start
time (field 22 of /proc/PID/stat); a pid whose start time differs is someone else's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def start_time(pid: int) -> int | None:
    """Clock ticks since boot at which `pid` started, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has ended; only its parent's wait() is missing
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcRef:
    """A process we started: its pid and start time, and what it is (for messages)."""

    pid: int
    started: int
    what: str

    @classmethod
    def of(cls, pid: int, what: str) -> ProcRef:
        started = start_time(pid)
        if started is None:
            raise ProcessLookupError(f"{what} (pid {pid}) is not running")
        return cls(pid, started, what)

    def alive(self) -> bool:
        return start_time(self.pid) == self.started

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcRef:
        return cls(int(data["pid"]), int(data["started"]), str(data["what"]))  # type: ignore[arg-type]


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(proc: ProcRef, grace_s: float = 3.0) -> bool:
    """SIGTERM, wait up to `grace_s`, then SIGKILL. Returns True when the process is gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        if not proc.alive():
            return True
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(proc.pid)
            if not proc.alive():
                return True
            time.sleep(0.02)
    return not proc.alive()


def mount_namespace(pid: int) -> str | None:
    """The mount namespace of a process (`mnt:[inode]`), or None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_mount_namespace(namespace: str) -> list[ProcRef]:
    """Live processes in that mount namespace; never anything of our own namespace."""
    if namespace == mount_namespace(os.getpid()):
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or mount_namespace(int(entry.name)) != namespace:
            continue
        started = start_time(int(entry.name))
        if started is not None:
            found.append(ProcRef(int(entry.name), started, "process left in the node namespace"))
    return found


def pids_with_env(name: str, value: str) -> list[ProcRef]:
    """Live processes whose environment has NAME=VALUE (never this process)."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        started = start_time(int(entry.name))
        if wanted in environ and started is not None:
            found.append(ProcRef(int(entry.name), started, "process of the node"))
    return found
