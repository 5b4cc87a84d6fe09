# Disk space of a state root: what its file system has free, what a deploy is about to write
# there (estimated before any change), and a guard that stops a long write (an env build)
# before it eats the reserve kept for the running trainer's checkpoints and status
# (dflash_disk_reserve_mb). Standard library only: the target's modules and the controller's
# filters use it alike.
from __future__ import annotations

import errno
import os

MB = 1024 * 1024
# A wheel's installed size against its compressed one: the CPU torch lock's wheelhouse is
# 240 MB and its env 1.2 GB (docs/disk-space.md). An estimate, with the reserve as margin.
WHEEL_EXPANSION = 5
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# What to free, in every message about space.
FREE_HINT = "Free space there (envs/ no release uses, old checkpoints, other files)"


class DiskSpaceError(Exception):
    pass


def existing(path: str) -> str:
    """`path`, or its nearest parent that exists (a state root not made yet)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def free_space(path: str) -> dict:
    """{path, free_bytes, total_bytes} of the file system that holds `path` (as a non-root
    user may use it)."""
    where = existing(path)
    stat = os.statvfs(where)
    return {
        "path": where,
        "free_bytes": stat.f_bavail * stat.f_frsize,
        "total_bytes": stat.f_blocks * stat.f_frsize,
    }


def tree_bytes(path: str) -> int:
    """Bytes the files under `path` take (a hard-linked file counted once)."""
    seen, total = set(), 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            stat = os.lstat(os.path.join(folder, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_blocks * 512
    return total


def megabytes(count: float) -> str:
    return f"{count / MB:,.0f} MB"


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL


def disk_full_message(path: str, err: OSError | str) -> str:
    """The sentence for a write that failed on a full disk: what failed, what is free, the fix."""
    free = free_space(path)
    return (
        f"no space left on the file system of {free['path']} ({megabytes(free['free_bytes'])} "
        f"free of {megabytes(free['total_bytes'])}): {err}. {FREE_HINT}, then run again"
    )


class DiskGuard:
    """For a long write under a state root: check() raises once the file system's free space
    falls under `reserve_bytes`, so the writer stops (and cleans up) before the disk fills
    under a running trainer."""

    def __init__(self, path: str, reserve_bytes: int) -> None:
        self.path, self.reserve_bytes = path, reserve_bytes

    def check(self) -> None:
        free = free_space(self.path)
        if self.reserve_bytes and free["free_bytes"] < self.reserve_bytes:
            raise DiskSpaceError(
                f"stopped: the file system of {free['path']} has {megabytes(free['free_bytes'])} "
                f"free, under the {megabytes(self.reserve_bytes)} kept free for the running "
                f"trainer (dflash_disk_reserve_mb). {FREE_HINT}, or lower the reserve, then "
                "run again"
            )


def deploy_need(state: dict, release_bytes: int, reserve_mb: int) -> dict:
    """What a deploy will write under the root, against what its file system has free:
    {parts: {what: bytes}, need_bytes, free_bytes, ok, msg}. `state` is preflight's read
    (dflash_facts: disk, release_check, wanted_env)."""
    disk = state.get("disk") or {}
    parts = {}
    if not (state.get("release_check") or {}).get("present"):
        parts["release (archive and files)"] = release_bytes
    env = state.get("wanted_env") or {}
    if env.get("estimate_bytes"):
        parts[f"env {env.get('lock_id')} ({env.get('estimate_basis')})"] = env["estimate_bytes"]
    need = sum(parts.values())
    reserve = reserve_mb * MB
    free = int(disk.get("free_bytes") or 0)
    # A deploy that writes nothing new (a no-op, a run.sh change) is never refused.
    ok = not disk or need == 0 or free >= need + reserve
    msg = (
        f"the file system of {disk.get('path')} has {megabytes(free)} free; this deploy writes "
        f"about {megabytes(need)} ("
        + ", ".join(f"{what} {megabytes(size)}" for what, size in parts.items())
        + f") and keeps {megabytes(reserve)} free for the running trainer "
        f"(dflash_disk_reserve_mb). Nothing was changed. {FREE_HINT}, or point dflash_root at "
        "a larger file system"
    )
    return {"parts": parts, "need_bytes": need, "free_bytes": free, "ok": ok, "msg": msg}
