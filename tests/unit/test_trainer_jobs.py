"""One trainer is one job: torchrun and its workers (each in a session of its own, as torchrun
starts them) count once; a second trainer counts again. Real processes, found through /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dflash_filters import trainer_findings

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import (
    find_trainers,
    jobs,
    stop_all,
)

# Like torchrun: a parent that starts two workers, each with start_new_session.
LAUNCHER = """
import subprocess, sys, time
for _ in range(2):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
time.sleep(120)
"""


def start(root: Path) -> subprocess.Popen:
    env = dict(os.environ, DFLASH_ROOT=str(root.resolve()))
    return subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, start_new_session=True)


def wait_for(root: Path, count: int) -> list[dict]:
    """The trainer processes once `count` are there, each in its own session: a worker is
    seen between its fork and its setsid (start_new_session) on a loaded machine."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = find_trainers(str(root))
        if len(found) >= count and all(p["pgid"] == p["pid"] for p in found):
            break
        time.sleep(0.05)
    return found


def test_a_launcher_and_its_workers_are_one_trainer_two_are_two(tmp_path: Path):
    first = start(tmp_path)
    second = None
    try:
        found = wait_for(tmp_path, 3)
        assert len(found) == 3 and len({p["pgid"] for p in found}) == 3
        assert jobs(found) == [first.pid]
        facts = {"trainers": {"processes": found}, "deployment": {"result": "healthy"}}
        assert trainer_findings(facts, 60) == []  # one trainer: nothing to report

        second = start(tmp_path)
        found = wait_for(tmp_path, 6)
        assert jobs(found) == sorted([first.pid, second.pid])
        facts["trainers"]["processes"] = found
        duplicate = [f for f in trainer_findings(facts, 60) if f["kind"] == "duplicate_trainer"]
        assert duplicate and duplicate[0]["pids"] == sorted([first.pid, second.pid])
    finally:
        stopped = stop_all(find_trainers(str(tmp_path)), 5)
        assert not stopped["survivors"]
        for proc in (first, second):
            if proc:
                proc.wait(5)
