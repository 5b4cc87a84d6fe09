"""A bench stops what it started (bench/leftovers.py), with real processes marked as run.sh marks
a trainer (DFLASH_ROOT): a bench that fails midway runs its stop and leaves nothing running; a
trainer its stop missed is killed and named, and fails a bench that had passed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from leftovers import left_running, stopped_at_exit


def fake_trainer(root: Path) -> subprocess.Popen:
    """A process of that state root as verify and stop.yml find one (run.sh's marker)."""
    env = {**os.environ, "DFLASH_ROOT": str(root.resolve())}
    proc = subprocess.Popen(["sleep", "600"], env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while proc.pid not in left_running(root) and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def test_a_bench_that_fails_midway_runs_its_stop_and_leaves_nothing(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    trainer = fake_trainer(root)
    stops = []

    def stop() -> None:  # as stop.yml does: the trainer ends
        stops.append(root)
        trainer.terminate()
        trainer.wait()

    with pytest.raises(RuntimeError, match="a deploy failed"), stopped_at_exit({root: stop}):
        raise RuntimeError("a deploy failed")
    assert stops == [root] and left_running(root) == []


def test_a_trainer_the_stop_missed_is_killed_and_fails_a_passing_bench(tmp_path, capsys):
    root, other = tmp_path / "state", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    trainer = fake_trainer(root)
    stopped_other = []
    stops = {root: lambda: None, other: lambda: stopped_other.append(1)}
    # The bench's own work went well; its stop.yml did not stop the trainer.
    with pytest.raises(SystemExit, match=f"{root}: pids {trainer.pid}"), stopped_at_exit(stops):
        pass
    assert trainer.wait(timeout=10) == -9 and left_running(root) == []
    assert stopped_other == [], "a root with nothing running and no failure is not stopped again"
    assert "still ran after stop.yml and were killed" in capsys.readouterr().err
