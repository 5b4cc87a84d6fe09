"""A real slowdown for tests: a process group kept stopped (SIGSTOP) for a share of the time
by a small process of its own, here or inside a container (python3 is all it needs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

# argv: PGID SHARE. Bursts of 2 ms run, each far shorter than a step of the test trainer (~20
# ms), so no step fits in one burst even when this process wakes late (a 20 ms burst let whole
# steps through on a loaded machine). The stop after each lasts `share / (1 - share)` times the
# burst as it really was, so a late wake-up lengthens the stop too and the group is stopped for
# `share` of the time whatever the load. Where it may (root with CAP_SYS_NICE), it wakes as a
# real-time process, on time beside busy ones. SIGTERM leaves the group running.
SCRIPT = """
import contextlib, os, signal, sys, time
pgid, share = int(sys.argv[1]), float(sys.argv[2])
def leave(*_):
    os.killpg(pgid, signal.SIGCONT)
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
with contextlib.suppress(OSError):
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
try:
    while True:
        began = time.monotonic()
        os.killpg(pgid, signal.SIGCONT)
        time.sleep(0.002)
        os.killpg(pgid, signal.SIGSTOP)
        time.sleep((time.monotonic() - began) * share / (1 - share))
except ProcessLookupError:
    pass
"""


@contextlib.contextmanager
def throttled(pgid: int, share: float) -> Iterator[subprocess.Popen]:
    """Process group `pgid` stopped `share` of the time (1 / (1 - share) times slower) while
    inside; running again after, also when the body fails."""
    throttle = subprocess.Popen([sys.executable, "-c", SCRIPT, str(pgid), str(share)])
    try:
        yield throttle
    finally:
        throttle.terminate()
        throttle.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
