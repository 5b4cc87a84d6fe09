# Preflight's questions to the target, answered by the facts module in its one call: can the
# state root be written, is the release being deployed intact there, and can the lock be built.
from __future__ import annotations

import os
import tempfile

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_envcheck import (
    lock_target_problems,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import file_drift
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    read_manifest,
    release_dir,
)


def writable(root: str) -> dict:
    """Whether files can be created in the root (or, before the first deploy, its parent): a
    real probe, since a read-only mount passes every permission check of root."""
    folder = root if os.path.isdir(root) else os.path.dirname(os.path.normpath(root))
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".dflash-probe-"):
            pass
    except OSError as err:
        return {"ok": False, "folder": folder, "error": err.strerror or str(err)}
    return {"ok": True, "folder": folder, "error": None}


def release_check(root: str, release: str) -> dict:
    """The release being deployed, if the target has it: its files against its manifest."""
    folder = release_dir(root, release)
    manifest = read_manifest(folder)
    if manifest is None:
        return {"release": release, "present": False, "drift": {}}
    return {"release": release, "present": True, "drift": file_drift(folder, manifest)}


def environment_check(lock: dict | None, check_hashes: bool = True) -> list[str]:
    """What keeps the lock from being built here (its Python, its wheelhouse, where
    `check_hashes` each wheel's hash); [] if nothing."""
    if not (isinstance(lock, dict) and lock.get("python")):
        return []
    return lock_target_problems(lock, check_hashes)
