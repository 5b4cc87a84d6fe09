"""python -m dflash.cache_files check|repair FOLDER: the compile cache's files and their hashes.

Inductor and Triton key each entry by what they compiled, never by what lies on disk: a file
damaged after it was written (a bad disk, a write cut short by hand, an edit) is loaded as it is
and runs; a damaged kernel .so ends the trainer with SIGSEGV at every start. So the files carry
their hashes: `hashes.json` in the folder, {format, files: {path: {sha256, size}}}, written by
the process that compiled them (the warmup when it ends, the trainer once its first steps ran
and at each checkpoint), checked by the supervisor before every start of the trainer and by the
toolkit's verify and deploy (which run this module from the release).

- check: prints {checked, damaged, unrecorded} as JSON; exit 0, or 1 when a file is damaged.
- repair: moves every damaged file aside to <folder>.failed-<UTC time>/<its path> (FAILED.json
  there says why), records the files nobody recorded yet (compiled by a process that died before
  it could), and prints {checked, damaged, unrecorded, moved_aside}. Inductor and Triton compile
  a missing entry anew: a folder that lost a file is colder, never wrong.

This module is the owner of hashes.json; standard library only (the toolkit runs it with the
target's own Python, and the supervisor imports it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dflash.codehash import sha256_file

HASHES = "hashes.json"
FORMAT = 1
# Files of the folder that are no compiled entry: the hashes themselves, the toolkit's marker of
# what built the folder, the reason a folder was set aside.
OWN_FILES = frozenset((HASHES, "built-by.json", "FAILED.json"))
# Inductor's and Triton's lock files: taken and left by every process, their content is nothing.
LOCK_DIRS = frozenset(("locks",))
FAILED_INFIX = ".failed-"  # as the toolkit and the supervisor name a folder set aside


def entry_files(folder: Path) -> dict[str, int]:
    """{relative path: size} of every compiled entry's file in the folder: not its locks, not
    temp files (a leading dot: Inductor's and Triton's writes before their rename)."""
    found: dict[str, int] = {}
    for parent, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in LOCK_DIRS]
        for name in files:
            if name.startswith(".") or name.endswith((".lock", ".tmp")) or name in OWN_FILES:
                continue
            path = Path(parent, name)
            with contextlib.suppress(OSError):  # gone since the walk read its folder
                found[str(path.relative_to(folder))] = path.stat().st_size
    return found


def read_hashes(folder: Path) -> dict[str, dict[str, Any]]:
    """The recorded {path: {sha256, size}}; {} without a readable hashes.json (a folder from
    before hashes, or one whose hashes.json was lost: its files count as unrecorded)."""
    try:
        data = json.loads((folder / HASHES).read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def write_hashes(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    """Whole or not at all: a temp file renamed into place."""
    temp = folder / f".{HASHES}.{os.getpid()}.tmp"
    temp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1, sort_keys=True))
    os.replace(temp, folder / HASHES)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """One reader-writer of hashes.json at a time (every rank records; a deploy may repair
    while a supervisor checks)."""
    locks = folder / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / "hashes.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def compare(folder: Path, recorded: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{checked, damaged, unrecorded, gone}: files whose bytes are not the recorded ones, files
    no process recorded, recorded files no longer there (a miss, not damage)."""
    present = entry_files(folder)
    damaged = []
    for path, size in sorted(present.items()):
        want = recorded.get(path)
        if want is None:
            continue
        if want.get("size") != size or want.get("sha256") != sha256_file(folder / path):
            damaged.append(path)
    return {
        "checked": sum(1 for path in present if path in recorded),
        "damaged": damaged,
        "unrecorded": sorted(path for path in present if path not in recorded),
        "gone": sorted(path for path in recorded if path not in present),
    }


def record(folder: Path) -> int:
    """Record the hashes of the files not yet recorded (what this process just compiled) and
    forget the files gone; a recorded file is never hashed again here (its damage is check's to
    find). Returns how many were added."""
    if not folder.is_dir():
        return 0
    with locked(folder):
        recorded = read_hashes(folder)
        present = entry_files(folder)
        new = {path: size for path, size in present.items() if path not in recorded}
        kept = {path: want for path, want in recorded.items() if path in present}
        if not new and len(kept) == len(recorded):
            return 0
        for path, size in new.items():
            kept[path] = {"sha256": sha256_file(folder / path), "size": size}
        write_hashes(folder, kept)
        return len(new)


def check(folder: Path) -> dict[str, Any]:
    """What compare says, read under the lock (no record half written)."""
    if not folder.is_dir():
        return {"checked": 0, "damaged": [], "unrecorded": [], "gone": []}
    with locked(folder):
        return compare(folder, read_hashes(folder))


def aside_folder(folder: Path) -> Path:
    """<folder>.failed-<UTC time>, numbered when another was set aside within the same second:
    where a suspect cache, or its damaged files, are kept for a person to look at."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside, count = folder.with_name(f"{folder.name}{FAILED_INFIX}{stamp}"), 1
    while aside.exists():  # another set aside within the same second
        count += 1
        aside = folder.with_name(f"{folder.name}{FAILED_INFIX}{stamp}-{count}")
    return aside


def repair(folder: Path, who: str) -> dict[str, Any]:
    """check, then move the damaged files aside (kept for a person to look at, FAILED.json
    saying why and `who` moved them) and record the unrecorded ones."""
    if not folder.is_dir():
        return {**check(folder), "moved_aside": None}
    with locked(folder):
        recorded = read_hashes(folder)
        found = compare(folder, recorded)
        aside = None
        if found["damaged"]:
            aside = aside_folder(folder)
            for path in found["damaged"]:
                (aside / path).parent.mkdir(parents=True, exist_ok=True)
                os.rename(folder / path, aside / path)
                recorded.pop(path)
            reason = (
                f"{len(found['damaged'])} file(s) differ from the hashes recorded when they were "
                f"compiled: {', '.join(found['damaged'])}"
            )
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            (aside / "FAILED.json").write_text(
                json.dumps({"reason": reason, "by": who, "time": stamp}, indent=2) + "\n"
            )
        for path in found["unrecorded"]:
            with contextlib.suppress(FileNotFoundError):
                size = (folder / path).stat().st_size
                recorded[path] = {"sha256": sha256_file(folder / path), "size": size}
        for path in found["gone"]:
            recorded.pop(path)
        if found["damaged"] or found["unrecorded"] or found["gone"]:
            write_hashes(folder, recorded)
        return {**found, "moved_aside": str(aside) if aside else None}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash.cache_files", description=__doc__)
    parser.add_argument("action", choices=("check", "repair"))
    parser.add_argument("folder", type=Path, help="a compile cache folder (cache/<fingerprint>)")
    parser.add_argument("--by", default="python -m dflash.cache_files", help="who repairs")
    args = parser.parse_args(argv)
    try:
        result = check(args.folder) if args.action == "check" else repair(args.folder, args.by)
    except OSError as exc:
        print(f"error: {args.folder}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True))
    return 1 if args.action == "check" and result["damaged"] else 0


if __name__ == "__main__":
    sys.exit(main())
