"""Nothing lost under faults: a full disk (a real tmpfs filled to the brim) never stops the
trainer, and the checkpoints left broken by killed writers are cleaned or skipped, and reported.

The tmpfs mounts need root (as in CI); without the right to mount, these tests skip."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from dflash import checkpoint
from dflash.supervision.status import StatusFile

from .conftest import FAST, REPO, argv, cli_env, log_losses, read_status, run_module

T = TypeVar("T")
NO_SPACE = os.strerror(errno.ENOSPC)


def top_up(filler: Path) -> None:
    """Append to `filler` until its disk is full: again after a writer has freed blocks."""
    with filler.open("ab", buffering=0) as handle:
        for size in (1 << 16, 4096):  # tmpfs hands out whole pages
            try:
                while handle.write(bytes(size)):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc


def fill(disk: Path) -> Path:
    """Fill `disk` to its last block; again while a writer beside it frees some (a status.json
    replaced, a checkpoint pruned), up to 100 times."""
    filler = disk / "filler"
    for _ in range(100):
        top_up(filler)
        if os.statvfs(disk).f_bavail == 0:
            return filler
    raise AssertionError(f"{disk} has {os.statvfs(disk).f_bavail} blocks free after 100 fills")


def poll(check: Callable[[], T | None], timeout: float = 120) -> T:
    """check() until it gives something true; a generous limit, no speed assumed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.05)
    raise AssertionError(f"not seen within {timeout} s")


def test_a_status_write_on_a_full_disk_keeps_the_last_file_and_says_so_later(tmpfs, capsys):
    disk = tmpfs("256k")
    path = disk / "status.json"
    status = StatusFile(path, "full", interval_s=0.01)
    status.write(state="running", step=1)
    before = path.read_bytes()
    filler = fill(disk)

    status.write(step=2)  # neither raises
    status.write(step=3)
    assert path.read_bytes() == before
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "status.json"]  # no temp file
    failing = status.snapshot()["disk_error"]
    assert failing["count"] == 2 and "recovered_at" not in failing
    warned = capsys.readouterr().err
    assert warned.count(f"warning: cannot write {path}: {NO_SPACE}") == 1, warned

    # The heartbeat thread lives through failed writes and writes again once there is room.
    status.start_heartbeat()
    try:
        poll(lambda: status.snapshot()["disk_error"]["count"] >= 5)
        filler.unlink()
        written = poll(lambda: (s := read_status(path)) and s.get("disk_error") and s)
    finally:
        status.stop_heartbeat()
    assert written["step"] == 3
    error = written["disk_error"]
    assert error["error"] == NO_SPACE and error["path"] == str(path)
    assert error["count"] >= 5 and error["at"] <= error["recovered_at"]
    assert f"{path} written again after {error['count']} failed writes" in capsys.readouterr().err
    assert sorted(p.name for p in disk.iterdir()) == ["status.json"]


@pytest.mark.parametrize("how", ["full disk", "larger than the disk"])
def test_a_checkpoint_the_disk_has_no_room_for_raises_and_leaves_no_temp_file(tmpfs, how):
    disk = tmpfs("256k")
    folder = disk / "ck"
    checkpoint.save(folder, 1, {"w": torch.zeros(1000)})
    if how == "full disk":
        fill(disk)
        payload = {"w": torch.zeros(1000)}
    else:
        payload = {"w": torch.zeros(1 << 18)}  # 1 MiB on a 256 KiB disk: fails mid-write
    with pytest.raises(checkpoint.CheckpointWriteError) as raised:
        checkpoint.save(folder, 2, payload)
    assert raised.value.errno == errno.ENOSPC and raised.value.strerror == NO_SPACE
    assert raised.value.filename == str(checkpoint.checkpoint_path(folder, 2))
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000001.pt"]
    found = checkpoint.load_latest(folder, warn=pytest.fail)
    assert found is not None and found[1]["step"] == 1


def test_a_checkpoint_that_fails_for_another_reason_raises_as_it_is(tmp_path):
    folder = tmp_path / "ck"
    with pytest.raises(Exception) as raised:  # a bug must not pass for a full disk
        checkpoint.save(folder, 1, {"not a tensor": lambda: None})
    assert not isinstance(raised.value, checkpoint.CheckpointWriteError)
    assert list(folder.iterdir()) == []


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_only_temp_files_of_writers_that_no_longer_run_are_removed(tmp_path):
    living = subprocess.Popen(["sleep", "60"])
    try:
        names = [
            f".step-00000003.pt.{dead_pid()}.tmp",  # removed
            f".step-00000004.pt.{os.getpid()}.tmp",  # removed: this pid has not saved yet
            f".step-00000005.pt.{living.pid}.tmp",  # another trainer may be writing it
            "step-00000002.pt",
            ".status.json.12.tmp",
        ]
        for name in names:
            (tmp_path / name).write_bytes(b"x")
        removed = checkpoint.remove_unfinished(tmp_path)
        assert removed == [(tmp_path / name, int(name.split(".")[3])) for name in names[:2]]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    finally:
        living.kill()
        living.wait()


def test_a_log_line_the_disk_has_no_room_for_is_lost_not_the_trainer(tmpfs):
    disk = tmpfs("256k")
    with (disk / "train.log").open("wb") as out:
        fill(disk)
        code = "from dflash.train import log\nfor _ in range(100): log('x' * 4096)"
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=cli_env(), stdout=out,
            stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


WARNING = re.compile(
    r"warning: checkpoint at step (\d+) not saved: no space left on device \((.+?)\); "
    r"training goes on, the last checkpoint is step (\d+)"
)


@pytest.mark.slow
def test_a_full_disk_loses_checkpoints_not_the_run(tmpfs, tmp_path):
    disk = tmpfs("6m")  # a checkpoint of the tiny drafter takes ~1.5 MB
    ck, status_path, log_path = disk / "ck", disk / "status.json", tmp_path / "train.log"
    every = argv("--checkpoint-every 3 --keep-checkpoints 1 --status-interval 0.2")
    files = ["--checkpoint-dir", str(ck), "--status-file", str(status_path), "--run-id", "full"]
    command = [sys.executable, "-m", "dflash.train", *FAST, "--max-steps", "10000", *every, *files]
    with log_path.open("w") as out:
        process = subprocess.Popen(
            command, cwd=tmp_path, env=cli_env(), stdout=out, stderr=subprocess.STDOUT
        )
    filler = disk / "filler"

    def full_and_training() -> str:
        """The log while the disk is kept full; the trainer runs and status.json stays whole."""
        top_up(filler)  # what a failed save freed goes to the filler again
        log = log_path.read_text()
        assert process.poll() is None, log
        assert read_status(status_path) is not None, "status.json torn or gone"
        return log

    try:
        poll(lambda: ((read_status(status_path) or {}).get("checkpoint") or {}).get("step"))
        fill(disk)
        failed = poll(lambda: WARNING.search(full_and_training()))
        step, last = int(failed[1]), int(failed[3])
        assert failed[2] == str(ck) and last < step
        # Training goes on, and the next interval tries again (and fails again).
        again = poll(lambda: WARNING.search(full_and_training(), failed.end()))
        assert int(again[1]) == step + 3 and int(again[3]) == last
        poll(lambda: max(log_losses(full_and_training())) > step + 3)

        filler.unlink()
        saved = poll(
            lambda: (
                (s := read_status(status_path))
                and (s["checkpoint"] or {}).get("step", 0) > step + 3
                and s
            )
        )
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log_path.read_text()
    finally:
        process.kill()
    log = log_path.read_text()
    assert f"checkpoint {saved['checkpoint']['path']}" in log
    assert saved["step"] > step + 3
    error = saved["checkpoint_error"]
    assert error["step"] >= step + 3 and error["error"] == NO_SPACE
    assert Path(error["path"]).parent == ck and not Path(error["path"]).exists()
    assert error["step"] < saved["checkpoint"]["step"]
    disk_error = saved["disk_error"]
    assert disk_error["error"] == NO_SPACE and disk_error["path"] == str(status_path)
    assert disk_error["count"] >= 1 and "recovered_at" in disk_error
    assert "warning: cannot write" in log  # stderr: once a spell, not every heartbeat
    stopped = read_status(status_path)
    assert stopped["state"] == "stopped"
    assert [p.name for p in ck.iterdir()] == [Path(stopped["checkpoint"]["path"]).name]
    assert sorted(p.name for p in disk.iterdir()) == ["ck", "status.json"]


@pytest.mark.slow
def test_a_start_removes_killed_writers_temps_and_reports_unreadable_checkpoints(tmp_path, trained):
    ck = tmp_path / "ck"
    ck.mkdir()
    good = ck / "step-00000002.pt"
    shutil.copy(trained / good.name, good)
    truncated = ck / "step-00000006.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    killed = ck / ".step-00000004.pt.999999.tmp"
    with pytest.raises(ProcessLookupError):
        os.kill(999999, 0)  # no such process: its writer was killed
    killed.write_bytes(good.read_bytes()[:1000])
    status_path = tmp_path / "status.json"
    files = ["--checkpoint-dir", str(ck), "--status-file", str(status_path), "--run-id", "t1"]
    args = [*FAST, *argv("--gen-samples 16 --max-steps 3"), *files]  # as `trained` ran

    result = run_module("dflash.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    removed = f"removed {killed}: a checkpoint left unfinished by a killed writer (pid 999999)"
    assert removed in result.stdout
    assert f"warning: skipping checkpoint {truncated}: cannot be read" in result.stdout
    assert f"resumed from {good} at step 2" in result.stdout
    status = json.loads(status_path.read_text())
    assert status["resumed_from_step"] == 2 and status["step"] == 3
    assert status["checkpoint_temp_removed"] == [str(killed)]
    [skipped] = status["checkpoint_skipped"]
    assert skipped["path"] == str(truncated) and skipped["step"] == 6 and skipped["error"]
    assert not killed.exists()
    assert truncated.stat().st_size == good.stat().st_size // 2  # kept: the user may want it
