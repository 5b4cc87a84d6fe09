"""The supervisor's writes (train.log lines, supervisor.json, history.jsonl lines, a compile
cache moved aside), each of which a full disk may refuse without ending the supervision of a
running trainer. Standard library only."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dflash.cache_files import aside_folder


def utc_text(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def append_line(path: Path, data: bytes) -> None:
    """One line appended to history.jsonl under its flock, which the toolkit's writers take
    too, on a line of its own: a torn last line (a writer killed mid-write) is first moved to
    history.jsonl.torn, as module_utils/dflash_state.py append_history does. A write cut short
    (disk full) is undone."""
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        content = handle.read()
        whole = content.rfind(b"\n") + 1 if not content.endswith(b"\n") else len(content)
        if whole < len(content):
            with open(path.with_name(path.name + ".torn"), "ab") as torn:
                torn.write(content[whole:] + b"\n")
            handle.truncate(whole)
        try:  # unbuffered: nothing is left to be written later by close()
            if os.write(handle.fileno(), data) != len(data):
                raise OSError(28, "No space left on device", str(path))
            os.fsync(handle.fileno())
        except OSError:
            handle.truncate(whole)
            raise


_LINE_CUT = False  # the last line was cut short (disk full): the next one starts on its own


def log(message: str) -> None:
    """One line of the supervisor's own in train.log (its stdout). A full disk may refuse the
    line or take only part of it: the line is lost, never the supervision (it wrote straight to
    the file descriptor, so nothing stays in a buffer to fail again at the next line or exit)."""
    global _LINE_CUT
    data = f"{utc_text(time.time())} supervisor: {message}\n".encode(errors="replace")
    if _LINE_CUT:
        data = b"\n" + data
    try:
        written = os.write(sys.stdout.fileno(), data)
    except (OSError, ValueError):  # ENOSPC, EDQUOT, EIO, a closed stdout
        written = 0
    _LINE_CUT = 0 < written < len(data)


def read_status(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(temp, path)
    except OSError as exc:  # a full disk must not end the supervision of a running trainer
        temp.unlink(missing_ok=True)
        log(f"cannot write {path}: {exc}")


def move_aside(folder: Path, reason: str, run_id: str) -> Path:
    """Rename a suspect compile cache to <folder>.failed-<UTC time>, with a FAILED.json inside
    that says why; the next trainer finds no folder, so Inductor makes it anew and compiles."""
    aside = aside_folder(folder)
    os.rename(folder, aside)
    write_atomic(
        aside / "FAILED.json", {"reason": reason, "run_id": run_id, "time": utc_text(time.time())}
    )
    return aside
