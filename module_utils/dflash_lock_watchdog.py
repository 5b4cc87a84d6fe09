# The deploy lock's watchdog: long work on the target (an env build, a warmup, a health wait)
# keeps the run's lock renewed and stops when the run that holds it is gone (docs/deploy-lock.md).
from __future__ import annotations

import threading

from ansible.module_utils.dflash_lockfile import LockError, fence, holder_alive


class Watchdog:
    """For long work on the target (an env build, a health wait): renews the lock every few
    seconds and notices when the run that holds it is gone (taken over, or its
    ansible-playbook process died where this machine can see it), so the work dies with the
    play instead of finishing as an orphan."""

    def __init__(self, root: str, token: str | None, interval_s: float = 3.0) -> None:
        self.root, self.token, self.interval_s = root, token, interval_s
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

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                lock = fence(self.root, str(self.token))
            except (LockError, OSError) as err:
                self.reason = str(err)
                self.lost.set()
                return
            if holder_alive(lock.get("holder") or {}) is False:
                self.reason = (
                    f"the ansible-playbook process that holds the deploy lock of {self.root} "
                    f"(pid {lock['holder'].get('pid')}) has died"
                )
                self.lost.set()
                return

    def check(self) -> None:
        if self.lost.is_set():
            raise LockError(f"{self.reason}; stopping this run's work on the target")
