# What killed writers leave under a state root, removed (or, for history, kept aside) by the
# next run that takes the deploy lock, each named in its output: nobody else writes these
# while that run holds the lock. The trainer's own temp files (checkpoints, status.json) are
# the trainer's to clean when it starts (dflash/checkpoint.py), never the toolkit's while one
# may run.
from __future__ import annotations

import os
import re
import shutil

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_cache_share import STAGING
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    CACHE,
    ENV_MARKER,
    ENVS,
    HISTORY,
    INCOMING,
    RUNS,
    TMP_PREFIX,
    append_history,
)

# write_json_atomic's `<name>.tmp-<pid>`, switch_current's `.tmp-current-<pid>`,
# point_latest's `.tmp-latest-<pid>`.
_TEMP = re.compile(rf"(^|\.){re.escape(TMP_PREFIX)}(current-|latest-)?\d+$")


def temp_files(root: str) -> list[str]:
    """Temp files of atomic writes under the root and runs/ (never renamed into place)."""
    found = []
    for folder in (root, os.path.join(root, RUNS)):
        if os.path.isdir(folder):
            found += [os.path.join(folder, n) for n in os.listdir(folder) if _TEMP.search(n)]
    return sorted(found)


def unfinished_envs(root: str) -> list[str]:
    """envs/<lock id> folders a build left without its marker (written last)."""
    folder = os.path.join(root, ENVS)
    if not os.path.isdir(folder):
        return []
    return sorted(
        os.path.join(folder, name)
        for name in os.listdir(folder)
        if os.path.isdir(os.path.join(folder, name))
        and not os.path.isfile(os.path.join(folder, name, ENV_MARKER))
    )


def incoming_archives(root: str) -> list[str]:
    folder = os.path.join(root, INCOMING)
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)) if os.path.isdir(
        folder) else []  # fmt: skip


def cache_staging(root: str) -> list[str]:
    """cache/<fingerprint>.incoming-<pid> folders of an unpack cut short (never read: only
    entries renamed into cache/<fingerprint> are)."""
    folder = os.path.join(root, CACHE)
    if not os.path.isdir(folder):
        return []
    pattern = re.compile(rf"{re.escape(STAGING)}\d+$")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if pattern.search(n))


def clean(root: str) -> list[str]:
    """Remove what killed writers left; one sentence per thing, naming it."""
    said = []
    for path in temp_files(root):
        os.unlink(path)
        said.append(f"removed {path}: a temp file of a write cut short")
    for path in incoming_archives(root):
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        said.append(f"removed {path}: an archive pushed by a run that did not unpack it")
    for path in cache_staging(root):
        shutil.rmtree(path)
        said.append(f"removed {path}: a compile cache unpack cut short")
    for path in unfinished_envs(root):
        shutil.rmtree(path)
        said.append(f"removed {path}: an env whose build was cut short (no {ENV_MARKER})")
    moved = close_torn_history(root)
    if moved:
        said.append(
            f"{os.path.join(root, HISTORY)} ended in a torn line {moved['line']} "
            f"({moved['bytes']} bytes, a writer cut short): moved to {moved['kept']}"
        )
    return said


def close_torn_history(root: str) -> dict | None:
    """A torn last line of history.jsonl moved aside, as an append would (nothing appended)."""
    if not os.path.isfile(os.path.join(root, HISTORY)):
        return None  # an append with nothing to write would create the file
    return append_history(root, None)
