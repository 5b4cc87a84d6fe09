# A compile cache as one archive, so that one host's warmup serves every host of the same
# fingerprint (the same torch, Triton, CUDA, GPU model, driver and compiled code): packed on
# the host that compiled it, kept on the controller, unpacked on the others. Inductor's and
# Triton's entries are keyed by their content and hold no path of the cache folder, so a
# folder of the same fingerprint takes them as they are (tests/integration/test_local_cache.py
# shows the hits). Standard library only.
from __future__ import annotations

import json
import os
import shutil
import tarfile

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    MARKER,
    built_for,
    mark,
)

# What a writer may leave half done beside the entries: Inductor's `.<pid>.<tid>.tmp` and
# its lock files; never packed.
_SKIPPED_DIRS = {"locks"}
STAGING = ".incoming-"


def _skipped(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def pack(cache_dir: str, archive: str) -> dict:
    """Write the cache (entries and marker) into `archive`, whole or not at all."""
    if not os.path.isfile(os.path.join(cache_dir, MARKER)):
        raise ValueError(f"{cache_dir} has no {MARKER}: only a completed warmup is shared")
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    temp = f"{archive}.tmp-{os.getpid()}"
    count = 0
    try:
        with tarfile.open(temp, "w:gz", compresslevel=3) as tar:
            for folder, dirs, names in os.walk(cache_dir):
                dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
                for name in sorted(n for n in names if not _skipped(n)):
                    path = os.path.join(folder, name)
                    if os.path.isfile(path) and not os.path.islink(path):
                        tar.add(path, arcname=os.path.relpath(path, cache_dir), recursive=False)
                        count += 1
        os.replace(temp, archive)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return {"files": count, "bytes": os.path.getsize(archive)}


def archive_marker(archive: str) -> dict | None:
    with tarfile.open(archive, "r:gz") as tar:
        try:
            member = tar.extractfile(MARKER)
        except KeyError:
            return None
        return json.load(member) if member else None


def warmup_inputs(built_by: dict) -> str:
    return f"flags {built_by.get('warmup_flags')}, environment {built_by.get('warmup_env') or {}}"


def refusal(archive: str, wanted: dict) -> str | None:
    """Why this host does not take the archive (another build's cache), or None."""
    built = archive_marker(archive)
    if built is None:
        return f"{archive} holds no {MARKER}: not a cache a warmup completed"
    if built != wanted:
        return (
            f"it was compiled for {built_for(built)} with {warmup_inputs(built)}; "
            f"this host needs {built_for(wanted)} with {warmup_inputs(wanted)}"
        )
    return None


def _safe_members(tar: tarfile.TarFile, archive: str) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    for member in members:
        parts = member.name.split("/")
        if not member.isfile() or member.name.startswith("/") or ".." in parts:
            raise ValueError(f"{archive}: {member.name!r} is not a plain file of a cache")
    return members


def unpack(archive: str, cache_dir: str, wanted: dict) -> int:
    """Add the archive's entries to the cache folder, then its marker: entries it has already
    are kept (the same key is the same content), each new one appears whole (renamed into
    place), and the marker, written last, publishes the cache. The number of files added."""
    staging = f"{cache_dir}{STAGING}{os.getpid()}"
    added = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in _safe_members(tar, archive) if m.name != MARKER]
            # Members are checked above; the data filter, where this Python has it, checks too.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staging, members=members, **safe)
        for member in members:
            target = os.path.join(cache_dir, member.name)
            if os.path.exists(target):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(staging, member.name), target)
            added += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    mark(cache_dir, wanted)
    return added
