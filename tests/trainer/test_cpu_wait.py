"""dflash.cpu_wait on real processes: a thread that shares its CPU with a burner waits for it,
a stopped one does not (so a throttled trainer still reads as slow, a starved one as starved)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash.cpu_wait import ThreadClock, unstarved_seconds

SPIN = "while True: pass"


def pinned(cpu: int) -> subprocess.Popen:
    """A busy-looping process bound to one CPU."""
    return subprocess.Popen(
        [sys.executable, "-c", SPIN], preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
    )


def measure(pid: int, seconds: float) -> tuple[float, float, float]:
    clock = ThreadClock(Path(f"/proc/{pid}/task"))
    start = time.monotonic()
    time.sleep(seconds)
    cpu = clock.step()
    assert cpu is not None, "schedstat is not readable on this kernel"
    return time.monotonic() - start, *cpu


def test_a_thread_beside_a_burner_on_its_cpu_waits_and_a_stopped_one_does_not():
    if not Path(f"/proc/{os.getpid()}/task").is_dir():
        pytest.skip("no /proc/<pid>/task: not Linux")
    cpu = min(os.sched_getaffinity(0))
    spinner, burner = pinned(cpu), pinned(cpu)
    try:
        time.sleep(0.3)  # both started
        wall, ran, waited = measure(spinner.pid, 2.0)
        # Two busy processes on one CPU: each runs about half the time and waits the rest
        # (more where the machine's other work shares that CPU too).
        assert waited > 0.25 * wall, (wall, ran, waited)
        assert unstarved_seconds(wall, (ran, waited)) < 0.75 * wall
        os.kill(spinner.pid, signal.SIGSTOP)
        while Path(f"/proc/{spinner.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "T":
            time.sleep(0.01)  # until the stop has landed
        wall, ran, waited = measure(spinner.pid, 2.0)
        # Stopped, it waits on no run queue: its time is not left out.
        assert ran < 0.1 and waited < 0.1, (wall, ran, waited)
        assert unstarved_seconds(wall, (ran, waited)) > 0.9 * wall
    finally:
        for process in (spinner, burner):
            process.kill()
            process.wait()


def test_unstarved_seconds_keep_the_busiest_threads_work_and_never_pass_the_wall_time():
    assert unstarved_seconds(2.0, None) == 2.0  # no schedstat: as measured
    assert unstarved_seconds(2.0, (0.5, 1.2)) == pytest.approx(0.8)
    assert unstarved_seconds(2.0, (1.5, 1.2)) == 1.5  # it ran 1.5 s: the step took that at least
    assert unstarved_seconds(2.0, (2.5, 0.0)) == 2.0  # threads side by side ran more than wall


def test_a_thread_that_ended_between_listing_and_reading_is_skipped(tmp_path: Path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "schedstat").write_text("2000000000 500000000 10\n")
    (tmp_path / "2").mkdir()  # its schedstat is gone
    clock = ThreadClock(tmp_path)
    assert clock.last == {"1": (2.0, 0.5)}
    (tmp_path / "1" / "schedstat").write_text("3000000000 1500000000 12\n")
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "schedstat").write_text("100000000 200000000 1\n")  # a new thread
    assert clock.step() == pytest.approx((1.0, 1.0))
