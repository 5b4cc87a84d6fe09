"""A bench stops what it started: when it ends, also when it fails midway, every state root it
deployed to is stopped through stop.yml, and no trainer of those roots may be left running (run.sh
marks each trainer process with DFLASH_ROOT; module_utils/dflash_procs.py finds them as verify
does). One left after stop.yml is killed and named, and the bench fails for it: a GPU held by a
bench's forgotten trainer is the next measurement's noise, or its out-of-memory."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the collection, by its one name
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import find_trainers

KILL_WAIT_S = 10.0


def left_running(root: Path) -> list[int]:
    """The pids of the trainer processes of this state root (supervisor, torchrun, ranks)."""
    return [info["pid"] for info in find_trainers(str(root))] if root.exists() else []


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (dead, its parent not yet told) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)


@contextlib.contextmanager
def stopped_at_exit(stops: dict[Path, Callable[[], object]]) -> Iterator[None]:
    """Around a bench's work: `stops` maps each state root to the call that runs stop.yml on
    it. On the way out, each root whose run failed midway or that still has trainers running is
    stopped; what stop.yml left is killed and named. The bench's own error, if any, goes on;
    else a trainer left after stop.yml fails the bench (SystemExit)."""
    failed = True
    try:
        yield
        failed = False
    finally:
        named = []
        for root, stop in stops.items():
            if not (failed or left_running(root)):
                continue
            try:
                stop()
            except Exception as exc:  # the stop's own failure must not hide what is left
                print(f"bench: stop.yml on {root} failed: {exc}", file=sys.stderr)
            left = left_running(root)
            if left:
                kill(left)
                named.append(f"{root}: pids {', '.join(map(str, left))}")
        if named:
            message = (
                "bench: trainer processes still ran after stop.yml and were killed ("
                + "; ".join(named)
                + ")"
            )
            print(message, file=sys.stderr)
            if not failed:
                raise SystemExit(message)
