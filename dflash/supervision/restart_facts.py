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


def log_tail(log: Path, since: int) -> str | None:
    """What the trainer wrote to `log` after byte `since` (where its attempt began), at most the
    last TAIL_BYTES; None when the log cannot be read."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(since, log_size(log) - TAIL_BYTES))
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def last_error(log: Path, since: int) -> str | None:
    """The last error line the trainer printed to `log` after byte `since` (where its attempt
    began), or None."""
    text = log_tail(log, since)
    if text is None:
        return None
    found = [line.strip() for line in text.splitlines() if ERROR_LINE.match(line.strip())]
    return found[-1][:500] if found else None


# The outermost frame of a `python -m` process's main thread: in faulthandler's dump (innermost
# frame first, the main thread after the others) the line that ends a process's dump.
MAIN_BOTTOM = " in _run_module_as_main"


def dumps_written(log: Path, since: int) -> int:
    """How many processes run with `python -m` have finished their faulthandler dump in `log`
    after byte `since` (their main thread's stack written to its outermost frame)."""
    text = log_tail(log, since)
    return 0 if text is None else text.count(MAIN_BOTTOM)


# faulthandler's frame line: `  File "/path", line 12 in call`.
FRAME_LINE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def compiled_entry(log: Path, since: int, cache: Path | None) -> str | None:
    """The compile cache entry a crash in native code ran in: of faulthandler's last dump
    (`Fatal Python error: ...`, then every thread's stack, the crashing one's headed `Current
    thread`, innermost frame first), the innermost frame of the crashing thread in a file of
    `cache` (Inductor's wrapper module of the compiled graph, which called the kernel), as
    `<path in the cache>, line N in <function>`; None when the crash was elsewhere."""
    text = log_tail(log, since) if cache is not None else None
    if text is None:
        return None
    at = text.rfind("Fatal Python error: ")
    if at < 0:
        return None
    folder = str(cache).rstrip("/") + "/"
    crashing = False
    for line in text[at:].splitlines()[1:]:
        if line.startswith(("Current thread ", "Stack (most recent call first)")):
            crashing = True
        elif crashing and not line.strip():  # the crashing thread's stack ends
            break
        elif crashing and (frame := FRAME_LINE.match(line)) and frame["path"].startswith(folder):
            return f"{frame['path'][len(folder) :]}, line {frame['line']} in {frame['func']}"
    return None
