# A command on the target that ends with the play: its own process group, killed as a whole
# when the run that asked for it loses its deploy lock (or its ansible-playbook dies) or its
# time is up. Used for env builds and compile-cache warmups, which take minutes.
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable


class CommandError(Exception):
    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode  # None when it did not exit by itself (timeout, lock lost)


def run_checked(
    cmd: list[str], timeout: int, what: str, env: dict | None = None,
    check: Callable[[], None] = lambda: None, cwd: str | None = None,
    timeout_name: str = "its timeout",
) -> str:  # fmt: skip
    """Run `cmd` in its own process group; `check()` raising (the play is gone) or the
    timeout ends it, and everything it started, at once."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                check()
                if time.monotonic() > deadline:
                    raise CommandError(f"{what} took longer than {timeout} s; raise {timeout_name}")
                time.sleep(0.2)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise CommandError(
            f"{what} failed (exit {proc.returncode}): {(stderr or stdout)[-2000:]}", proc.returncode
        )
    return stdout
