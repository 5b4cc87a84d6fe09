"""A stop request that a signal handler may set: no lock anywhere.

A Python signal handler runs in the main thread, between two of its bytecodes. One that calls
threading.Event.set() takes the event's lock; when the signal lands while the main thread
holds that same lock (inside Event.wait(), around its sleep), the handler waits for the main
thread, which waits for the handler: the process trains on with its heartbeat, never steps
again, and is killed without its checkpoint when its stop times out. Here the handler sets a
flag and writes a byte to a pipe (both lock-free); wait() sleeps in select() on that pipe, so it
ends at once when the flag is set, whenever the signal lands. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select


class StopFlag:
    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def set(self) -> None:
        """Safe in a signal handler."""
        self._set = True
        with contextlib.suppress(BlockingIOError):  # a full pipe already wakes wait()
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, or until set; whether it is set."""
        if not self._set:
            select.select([self._read], [], [], timeout)
        return self._set
