"""What a restart line says that the ended trainer could not say itself: the newest checkpoint on
disk when the restart is recorded (a trainer that died at its start wrote no status; one judged
hung may have saved one more during its stack dump), the error its own output ended with (a
trainer killed by a signal, or dead before its status.json, names none), and the release it ran.
No torch: the supervisor imports this."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import dflash

# The last line of a Python traceback, or faulthandler's line for a crash in native code.
ERROR_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*|Fatal Python error: .+)$"
)
TAIL_BYTES = 64 * 1024  # an error is near the end; the log may be gigabytes


def checkpoint_dir(command: Sequence[str]) -> Path | None:
    """The trainer's --checkpoint-dir (run.sh always gives one), or None."""
    for i, word in enumerate(command):
        if word == "--checkpoint-dir" and i + 1 < len(command):
            return Path(command[i + 1])
        if word.startswith("--checkpoint-dir="):
            return Path(word.split("=", 1)[1])
    return None


def release_name() -> str | None:
    """The release of the MANIFEST.json beside the dflash package this process imported (the
    trainer's own rule: "unreleased" without one), or None when it cannot be read."""
    manifest = Path(dflash.__file__).resolve().parent.parent / "MANIFEST.json"
    if not manifest.exists():
        return "unreleased"
    try:
        return str(json.loads(manifest.read_text())["release"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def last_error(log: Path, since: int) -> str | None:
    """The last error line the trainer printed to `log` after byte `since` (where its attempt
    began), or None."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(since, log_size(log) - TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    found = [line.strip() for line in text.splitlines() if ERROR_LINE.match(line.strip())]
    return found[-1][:500] if found else None
