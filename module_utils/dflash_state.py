# The state layout on a target (DESIGN.md "State on a target") and the reads and writes on it
# that several modules share: releases, the `current` link, history.jsonl.
from __future__ import annotations

import contextlib
import json
import os
import shutil

try:  # in a module: Ansible ships module_utils as ansible.module_utils.*
    from ansible.module_utils.dflash_lines import GOOD_RESULTS
    from ansible.module_utils.dflash_release import MANIFEST_NAME, release_id_problem, sha256_bytes
except ImportError:  # on the controller: module_utils/ is on the venv's path (pyproject.toml)
    from dflash_lines import GOOD_RESULTS
    from dflash_release import MANIFEST_NAME, release_id_problem, sha256_bytes

# The names under a state root, here and nowhere else (the deploy lock's file is
# module_utils/dflash_lockfile.py's LOCK).
RELEASES = "releases"
CURRENT = "current"
HISTORY = "history.jsonl"
INCOMING = ".incoming"
TMP_PREFIX = ".tmp-"
RUN_SH = "run.sh"
RUNS = "runs"
ENVS = "envs"
CACHE = "cache"
# In runs/<run id>/: the trainer's heartbeat and its log.
STATUS = "status.json"
# The trainer's supervisor's record of a run: restarts, goodput (dflash/supervise.py).
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
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


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


def read_history(root: str) -> list[dict]:
    """history.jsonl entries, oldest first; a torn last line (killed writer) is skipped."""
    path = os.path.join(root, HISTORY)
    entries: list[dict] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                with contextlib.suppress(ValueError):
                    entries.append(json.loads(line))
    except FileNotFoundError:
        pass
    return entries


def append_history(root: str, entry: dict) -> None:
    line = json.dumps(entry, sort_keys=True) + "\n"
    fd = os.open(os.path.join(root, HISTORY), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


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
    """Releases beyond the `keep` most recently deployed good ones, sparing `protected`."""
    recent: list[str] = []
    for entry in reversed(history):
        release = entry.get("release")
        if entry.get("result") in GOOD_RESULTS and release in available and release not in recent:
            recent.append(release)
    kept = set(recent[:keep]) | protected
    return [name for name in available if name not in kept]


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
