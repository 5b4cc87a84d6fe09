"""The supervisor's hang kill: which processes get the stack-dump signal, and how long it waits
for their stacks to reach the log before the kill (real processes and faulthandler dumps)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash.supervision import supervisor as supervise
from dflash.supervision.restart_facts import dumps_written, log_size

SLEEP = "import time; time.sleep(60)"
# A stand-in trainer, run as `python -m` as the trainer is: faulthandler on SIGUSR1 (as
# dflash.train does) and a second thread, stopped by its own SIGSTOP (a hang) once ready.
HUNG = """
import faulthandler, os, signal, sys, threading, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(60)
"""


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def start(procs: list[subprocess.Popen[bytes]], argv: list[str], **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(argv, **kwargs)
    procs.append(proc)
    return proc


def test_the_dump_signal_goes_to_trainers_and_torchrun_workers_not_to_torchrun(started):
    trainer = start(started, [sys.executable, "-c", SLEEP, "-m", "dflash.train", "--cpu"])
    launcher = [sys.executable, "-c", SLEEP, "-m", "torch.distributed.run", "--standalone"]
    torchrun = start(started, [*launcher, "-m", "dflash.train"])
    other = start(started, [sys.executable, "-c", SLEEP, "-m", "dflash.trainer"])
    time.sleep(0.2)  # their command lines are theirs once exec'd
    assert supervise.is_trainer(trainer.pid)
    assert not supervise.is_trainer(torchrun.pid)
    assert not supervise.is_trainer(other.pid)
    trainer.kill()
    trainer.wait()
    assert not supervise.is_trainer(trainer.pid)  # gone


def wait_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while "ready" not in log.read_text() or not Path(f"/proc/{proc.pid}/stat").read_text().split(
        ") "
    )[1].startswith("T"):  # fmt: skip
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def test_the_kill_waits_for_the_whole_dump_of_a_stopped_trainer(started, tmp_path, monkeypatch):
    monkeypatch.setattr(supervise, "DUMP_WAIT_S", 600.0)  # only the dump can end the wait
    (tmp_path / "hung_trainer.py").write_text(HUNG)
    log = tmp_path / "train.log"
    with log.open("wb") as out:
        hung = start(started, [sys.executable, "-m", "hung_trainer"], cwd=tmp_path, stdout=out,
                     stderr=subprocess.STDOUT)  # fmt: skip
    wait_ready(hung, log)
    since = log_size(log)
    supervise.signal_all([hung.pid], signal.SIGUSR1)
    supervise.signal_all([hung.pid], signal.SIGCONT)
    supervise.wait_for_stacks(log, since, 1)
    dump = log.read_text()[since:]
    assert dumps_written(log, since) == 1
    # Both threads, the main one last, to its outermost frame.
    assert dump.count("(most recent call first):") == 2, dump
    assert 'hung_trainer.py", line ' in dump and dump.rstrip().endswith("_run_module_as_main")


def test_a_trainer_that_writes_no_stacks_is_killed_after_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(supervise, "DUMP_WAIT_S", 1.0)
    log = tmp_path / "train.log"
    log.write_text('Thread 0x00007f (most recent call first):\n  File "x.py", line 1 in f\n')
    began = time.monotonic()
    supervise.wait_for_stacks(log, 0, 1)  # a thread's stack, but no main thread's: not whole
    assert time.monotonic() - began >= 1.0
    assert dumps_written(log, 0) == 0
