"""status.json (dflash/README.md): what this process is, runs and has done, rewritten atomically.

A heartbeat thread rewrites the file every `interval_s` seconds whatever the main thread does
(long compiles, long steps), so `updated_at` proves the process is alive. Of several ranks only
the lead writes: the others keep a disabled StatusFile, whose writes do nothing.

A write that fails (a full disk) never stops the trainer: the file keeps its last content, and
`disk_error` says what happened in the next write that succeeds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from dflash.provenance import code_tree_sha256, release_name, versions
from dflash.supervision.states import state_fields


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def print_line(line: str, file: TextIO | None = None) -> None:
    """print() for log lines: a line that cannot be written (a full disk under the log) is
    lost, not the process."""
    with contextlib.suppress(OSError):
        print(line, file=file, flush=True)


class StatusFile:
    def __init__(self, path: Path, run_id: str, interval_s: float, enabled: bool = True) -> None:
        self.path = path
        self.interval_s = interval_s
        self.enabled = enabled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fields: dict[str, Any] = {
            "pid": os.getpid(),
            "run_id": run_id,
            **state_fields("starting"),
            "code_tree_sha256": code_tree_sha256(),
            "release": release_name(),
            "versions": versions(),
            "gpus": {"target": [], "drafter": []},
            "step": 0,
            "tokens_per_s": 0.0,
            "throughput_window": None,  # {steps, size} that tokens_per_s covers, once steps run
            # The median-step tokens/s of the last completed windows, oldest first, and the
            # steps' own noise (MAD over median): what verify.yml judges a drop by.
            "throughput_windows": [],
            # The same with the time the trainer's threads waited for a CPU left out (a busy
            # host is not a slower trainer: dflash.cpu_wait), windows and rolling figure.
            "throughput_windows_unstarved": [],
            "unstarved_tokens_per_s": None,
            "step_spread": None,
            "loss": None,
            "started_at": utc_now(),
            "updated_at": None,
            "checkpoint": None,  # {path, step, at} of the newest checkpoint this run saved or read
            "checkpoint_seconds": 0.0,  # spent saving checkpoints since this process started
            "stages": None,  # seconds per step by stage (dflash.stages), once steps run
            # The compile cache this process started on and the canary of its first steps
            # (dflash.compile_watch): {dir, fingerprint, started_warm, first_step_s, hits,
            # misses, canary}.
            "compile_cache": None,
            # Step progress, which the supervisor (dflash.supervise) judges a hang by: a fresh
            # heartbeat proves the process lives, only a new step proves it trains.
            "first_step_at": None,
            "last_step_at": None,
            "step_s_median": None,
            # Which start of this run the process is (0 first, 1 after the first restart...).
            "attempt": int(os.environ.get("DFLASH_ATTEMPT", "0")),
        }

    def update(self, **fields: Any) -> None:
        """Change fields; the next heartbeat writes them."""
        if "state" in fields:
            fields = {**fields, **state_fields(fields["state"])}
        with self._lock:
            self._fields.update(fields)

    def write(self, **fields: Any) -> None:
        """Change fields and write now (state changes, checkpoints)."""
        self.update(**fields)
        with self._lock:
            self._write_locked()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._fields)

    def _write_locked(self) -> None:
        if not self.enabled:
            return
        now = utc_now()
        fields = {**self._fields, "updated_at": now}
        failing = self._failing()
        if failing:  # this write, if it succeeds, ends the problem
            fields["disk_error"] = {**failing, "recovered_at": now}
        try:
            self._replace(fields)
        except OSError as exc:
            self._remember(exc, now)
            return
        self._fields = fields
        if failing:
            count = failing["count"]
            print_line(f"{now} {self.path} written again after {count} failed writes", sys.stderr)

    def _replace(self, fields: dict[str, Any]) -> None:
        """Write a temp file and rename it over the file; a failed write leaves the file as it
        was and no temp file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temp.write_text(json.dumps(fields, indent=2) + "\n")
            os.replace(temp, self.path)
        except OSError:
            temp.unlink(missing_ok=True)
            raise

    def _failing(self) -> dict[str, Any] | None:
        """`disk_error` while writes fail (none succeeded since), else None."""
        error = self._fields.get("disk_error")
        return error if error and "recovered_at" not in error else None

    def _remember(self, exc: OSError, now: str) -> None:
        """Keep a failed write in the fields, for the next write that succeeds; the first
        failure of a spell is also said on stderr (not every heartbeat)."""
        error = exc.strerror or str(exc)
        failing = self._failing()
        if failing is None:
            failing = {"error": error, "path": str(self.path), "at": now, "count": 0}
            print_line(
                f"{now} warning: cannot write {self.path}: {error}; it keeps its last content "
                "until a write succeeds, training goes on",
                sys.stderr,
            )
        self._fields["disk_error"] = {**failing, "error": error, "count": failing["count"] + 1}

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="status-heartbeat", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                self._write_locked()
