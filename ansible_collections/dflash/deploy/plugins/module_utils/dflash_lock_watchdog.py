# The deploy lock's watchdog: long work on the target (an env build, a warmup, a health wait)
# keeps the run's lock renewed and stops when the run that holds it is gone (docs/deploy-lock.md).
from __future__ import annotations

import threading
import time

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    LockError,
    fence,
    holder_alive,
)


class Watchdog:
    """For long work on the target (an env build, a health wait): renews the lock every few
    seconds and notices when the run that holds it is gone, so the work dies with the play
    instead of finishing as an orphan. Gone: the lock taken over; its ansible-playbook process
    dead, where this machine can see it (the local target); or, where it cannot (a container,
    another host) and `poll_timeout_s` is set, no module run of the play has reached the target
    for that long (a background job's wait, dflash_wait, reaches it every few seconds)."""

    def __init__(
        self, root: str, token: str | None, interval_s: float = 3.0, poll_timeout_s: float = 0
    ) -> None:
        self.root, self.token, self.interval_s = root, token, interval_s
        self.poll_timeout_s = poll_timeout_s
        self.lost = threading.Event()
        self.reason = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lock-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        if self.token:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _play_gone(self) -> str:
        """Why the play that holds the lock is gone, or "" while it is not (renews the lock)."""
        try:
            lock = fence(self.root, str(self.token), polled=False)
        except (LockError, OSError) as err:
            return str(err)
        holder = lock.get("holder") or {}
        alive = holder_alive(holder)
        if alive is False:
            return (
                f"the ansible-playbook process that holds the deploy lock of {self.root} "
                f"(pid {holder.get('pid')}) has died"
            )
        polled = lock.get("polled_epoch")
        if alive is None and self.poll_timeout_s and isinstance(polled, (int, float)):
            silent = time.time() - polled
            if silent > self.poll_timeout_s:
                return (
                    f"no task of the play that holds the deploy lock of {self.root} "
                    f"({holder.get('user', '?')}@{holder.get('host', '?')}, pid "
                    f"{holder.get('pid', '?')}) has reached this target for {silent:.0f} s "
                    f"(more than {self.poll_timeout_s:g} s): its ansible-playbook is taken for dead"
                )
        return ""

    def _look(self) -> bool:
        """Look once; True (and `lost` set, with the reason) when the play is gone."""
        reason = self._play_gone()
        if reason:
            self.reason = reason
            self.lost.set()
        return bool(reason)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._look():
                return

    def check(self) -> None:
        """Raise if the watchdog found the play gone (the health wait calls it every poll)."""
        if self.lost.is_set():
            raise LockError(f"{self.reason}; stopping this run's work on the target")

    def check_now(self, before: str) -> None:
        """Look now, before a change (`before`: what it is): an orphan of a dead play must not
        stop, start or record anything, even in the seconds between two of its looks."""
        if not self.token or not (self.lost.is_set() or self._look()):
            return
        raise LockError(f"{self.reason}; not going on to {before}: nothing more is changed")
