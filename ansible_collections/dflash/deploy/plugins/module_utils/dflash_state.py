# The state layout on a target (docs/state.md) and the reads and writes on it
# that several modules share: releases, the `current` link, history.jsonl.
from __future__ import annotations

import contextlib
import difflib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Callable

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import GOOD_RESULTS
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import (
    MANIFEST_NAME,
    release_id_problem,
    sha256_bytes,
)

# The names under a state root, here and nowhere else (the deploy lock's file is
# module_utils/dflash_lockfile.py's LOCK).
RELEASES = "releases"
CURRENT = "current"
HISTORY = "history.jsonl"
# Where append_history keeps a torn last line of history.jsonl (a writer killed mid-write).
HISTORY_TORN = "history.jsonl.torn"
INCOMING = ".incoming"
TMP_PREFIX = ".tmp-"
RUN_SH = "run.sh"
RUNS = "runs"
ENVS = "envs"
CACHE = "cache"
# In envs/<lock id>/: written last by a build, so an env without it is one cut short.
ENV_MARKER = ".dflash-env.json"
# In runs/<run id>/: the trainer's heartbeat and its log.
STATUS = "status.json"
# The trainer's supervisor's record of a run: restarts, goodput (dflash/supervision/supervisor.py).
SUPERVISOR = "supervisor.json"
TRAIN_LOG = "train.log"


def run_path(root: str, run_id: str, name: str) -> str:
    """A file of one run: runs/<run id>/<name>."""
    return os.path.join(root, RUNS, run_id, name)


class StateError(Exception):
    pass


def release_dir(root: str, release: str) -> str:
    problem = release_id_problem(release)
    if problem:
        raise StateError(
            f"release '{release}' is not a valid release id: {problem}; "
            "use a tag name such as v1.4.0 or a release id that history.yml lists"
        )
    return os.path.join(root, RELEASES, release)


def release_file_reader(root: str) -> Callable[[str, str], bytes | None]:
    """read(release, path): a file of a release on this target, None when it is not there
    (what history's diffs compare)."""

    def read(release: str, path: str) -> bytes | None:
        try:
            with open(os.path.join(release_dir(root, release), path), "rb") as handle:
                return handle.read()
        except OSError:
            return None

    return read


def read_json(path: str) -> dict | None:
    """A JSON file's content, or None when it is missing or torn."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_json_atomic(path: str, data: dict) -> None:
    """Write a JSON file whole or not at all (a temp file renamed over it)."""
    tmp = f"{path}.{TMP_PREFIX}{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
        os.replace(tmp, path)
    except OSError:  # a full disk: no temp file left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_manifest(folder: str) -> dict | None:
    return read_json(os.path.join(folder, MANIFEST_NAME))


def release_manifests(root: str) -> dict[str, dict]:
    """Manifest of every complete release; temp folders of unfinished unpacks excluded."""
    folder = os.path.join(root, RELEASES)
    if not os.path.isdir(folder):
        return {}
    found = {}
    for name in sorted(os.listdir(folder)):
        manifest = None if name.startswith(".") else read_manifest(os.path.join(folder, name))
        if manifest is not None:
            found[name] = manifest
    return found


def list_releases(root: str) -> list[str]:
    """Complete releases (those with a manifest), sorted."""
    return list(release_manifests(root))


def read_run_script(root: str) -> dict:
    """run.sh as it is on the target: path, text and sha256 (None for both when missing)."""
    path = os.path.join(root, RUN_SH)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return {"path": path, "content": None, "sha256": None}
    return {"path": path, "content": data.decode(errors="replace"), "sha256": sha256_bytes(data)}


def changed_lines(recorded: str | None, now: str | None, limit: int = 12) -> list[str]:
    """The lines an edit removed (`-`) and added (`+`) between a recorded text and the file
    now, at most `limit` of them (then how many more); [] when either is unknown or equal."""
    if recorded is None or now is None or recorded == now:
        return []
    diff = difflib.unified_diff(recorded.splitlines(), now.splitlines(), lineterm="", n=0)
    lines = [line for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++")]
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


def current_release(root: str) -> tuple[str | None, str | None]:
    """(release, raw link text) of `current`; release is None when missing or dangling."""
    link = os.path.join(root, CURRENT)
    try:
        target = os.readlink(link)
    except OSError:
        return None, None
    name = os.path.basename(os.path.normpath(target))
    if read_manifest(os.path.join(root, RELEASES, name)) is None:
        return None, target
    return name, target


def switch_current(root: str, release: str) -> None:
    """Point `current` at the release atomically: a new link under a temp name, then rename."""
    tmp = os.path.join(root, f"{TMP_PREFIX}current-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(os.path.join(RELEASES, release), tmp)
    os.replace(tmp, os.path.join(root, CURRENT))
    fsync_dir(root)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_history_checked(root: str) -> tuple[list[dict], list[dict]]:
    """history.jsonl's entries, oldest first, and its damaged lines: each {line (from 1),
    bytes, text (the start of it)} of a line that is not one JSON object (a writer cut short,
    a hand edit). Readers skip those, and say so."""
    path = os.path.join(root, HISTORY)
    entries: list[dict] = []
    damaged: list[dict] = []
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw)
                except ValueError:
                    entry = None
                if isinstance(entry, dict):
                    entries.append(entry)
                else:
                    text = raw.decode("utf-8", "replace").rstrip("\n")
                    damaged.append({"line": number, "bytes": len(raw), "text": text[:80]})
    except FileNotFoundError:
        pass
    return entries, damaged


def read_history(root: str) -> list[dict]:
    """history.jsonl's entries, oldest first (damaged lines skipped: read_history_checked)."""
    return read_history_checked(root)[0]


def _torn_tail(fd: int, size: int) -> int:
    """Where the file's last complete line ends: `size` unless the file ends inside a line."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        if end == size and chunk.endswith(b"\n"):
            return size
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def append_history(root: str, entry: dict | None) -> dict | None:
    """Append one line, whole or not at all (None: only the repair below). A last line left
    torn by a killed writer is first moved to history.jsonl.torn (kept, never lost) so that the
    new line starts on a line of its own; that move is returned ({line, bytes, kept}), else
    None. Writers take the file's flock (the trainer's supervisor too:
    dflash/supervision/record.py)."""
    line = b"" if entry is None else (json.dumps(entry, sort_keys=True) + "\n").encode()
    path = os.path.join(root, HISTORY)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    moved = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        whole = _torn_tail(fd, size)
        if whole < size:
            moved = _keep_torn(root, os.pread(fd, size - whole, whole), whole, fd)
            os.ftruncate(fd, whole)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        except OSError:
            os.ftruncate(fd, whole)  # a short write (disk full) leaves no torn line behind
            raise
        os.fsync(fd)
    finally:
        os.close(fd)
    return moved


def _keep_torn(root: str, tail: bytes, offset: int, fd: int) -> dict:
    lines = os.pread(fd, offset, 0).count(b"\n") + 1
    kept = os.path.join(root, HISTORY_TORN)
    with open(kept, "ab") as handle:
        handle.write(tail + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    return {"line": lines, "bytes": len(tail), "kept": kept}


def deployment_index(history: list[dict], release: str | None) -> int | None:
    """Index of the history line that made `release` current: its newest good line."""
    for index in range(len(history) - 1, -1, -1):
        entry = history[index]
        if entry.get("release") == release and entry.get("result") in GOOD_RESULTS:
            return index
    return None


def previous_deployment(
    history: list[dict], current: str | None, available: list[str]
) -> str | None:
    """The release deployed before `current`, following history (never file dates)."""
    for entry in reversed(history):
        release = entry.get("release")
        if release == current or release not in available:
            continue
        if entry.get("result") in GOOD_RESULTS:
            return release
    return None


def releases_to_prune(
    history: list[dict], available: list[str], keep: int, protected: set[str]
) -> list[str]:
    """Releases beyond the `keep` most recently deployed good ones, sparing `protected` and
    every release history does not name (unknown_releases): history is the record of what may
    be deleted, and one that was lost or cut short must not delete what it forgot."""
    recent: list[str] = []
    for entry in reversed(history):
        release = entry.get("release")
        if entry.get("result") in GOOD_RESULTS and release in available and release not in recent:
            recent.append(release)
    kept = set(recent[:keep]) | protected | set(unknown_releases(history, available))
    return [name for name in available if name not in kept]


def unknown_releases(history: list[dict], available: list[str]) -> list[str]:
    """Releases on the target that no line of history names (history lost or cut short, or a
    run killed before its record): never pruned, and named where keep-N runs."""
    named = {entry.get("release") for entry in history}
    return [name for name in available if name not in named]


def remove_tree(path: str) -> None:
    """Remove a release folder: rename it out of the way first, so a kill midway never leaves
    a half-deleted folder under a release name."""
    parent, name = os.path.split(path)
    doomed = os.path.join(parent, f"{TMP_PREFIX}rm-{name}-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def stale_temp_dirs(root: str) -> list[str]:
    folder = os.path.join(root, RELEASES)
    if not os.path.isdir(folder):
        return []
    return sorted(
        os.path.join(folder, name) for name in os.listdir(folder) if name.startswith(TMP_PREFIX)
    )
