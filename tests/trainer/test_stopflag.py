"""The stop request a signal handler sets (dflash/stopflag.py): it ends a sleep at once,
wherever the signal lands, and never blocks in the handler."""

from __future__ import annotations

import signal
import time

import pytest

from dflash.stopflag import StopFlag


@pytest.fixture
def alarm_sets():
    """SIGALRM calls set() on the flag the test gives, as SIGTERM does in the trainer."""
    flags: list[StopFlag] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: flags[0].set())
    yield flags
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_a_signal_during_the_sleep_ends_it(alarm_sets):
    flag = StopFlag()
    alarm_sets.append(flag)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    start = time.monotonic()
    assert flag.wait(60) is True
    assert time.monotonic() - start < 30  # ended by the signal, not by the 60 s timeout
    assert flag.is_set() and flag.wait(60) is True  # set stays set: no second sleep


def test_a_signal_before_the_sleep_is_not_lost(alarm_sets):
    flag = StopFlag()
    alarm_sets.append(flag)
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    time.sleep(0.5)  # the handler ran before wait() was called
    start = time.monotonic()
    assert flag.wait(60) is True and time.monotonic() - start < 30


def test_set_never_blocks_however_often_it_is_called():
    """A handler that blocks hangs the process as surely as one that waits for a lock: the
    pipe's buffer (64 KiB) filled many times over, nobody reading it, set() still returns."""
    flag = StopFlag()
    for _ in range(200_000):
        flag.set()
    assert flag.wait(0) is True
