"""The containers' shared base root file system: debootstrap once, then reuse from a cache.

The cache lives outside the checkout, one folder per recipe (keyed by the recipe's hash), so a
changed recipe builds a new base and later runs skip the ~40 s debootstrap. A build goes into a
temporary name and is renamed into place only when complete, so a killed build never leaves a
half-built base behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .mirror import debian_mirror

CACHE_ROOT = Path(os.environ.get("DFLASH_TESTBED_CACHE", "/var/cache/dflash-testbed"))

# Bump POST_VERSION whenever post_process() changes: it is part of the cache key.
POST_VERSION = 1
DEFAULT_PACKAGES = ("python3", "python3-venv", "procps")


def recipe(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> dict[str, object]:
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {
        "suite": "bookworm",
        "variant": "minbase",
        "include": sorted(packages),
        "arch": arch,
        "post_version": POST_VERSION,
    }


def recipe_key(rec: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:16]


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` (debootstrap mounts /proc and /sys into its target)."""
    prefix = str(path.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            found.append(target)
    return found


def _remove_build_dir(path: Path) -> None:
    """Remove a (possibly half-built) tree, unmounting what a killed debootstrap left in it."""
    for target in sorted(_mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], check=False, capture_output=True)
    if _mounts_under(path):
        raise RuntimeError(f"refusing to delete {path}: it still has mounts inside")
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _cache_lock(cache_root: Path) -> Iterator[None]:
    """One builder at a time across processes (two pytest sessions, or a CLI and pytest)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    with (cache_root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _post_process(rootfs: Path) -> None:
    # Downloaded .debs are not needed once installed; they are a third of the size.
    for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    (rootfs / "etc/hostname").write_text("localhost\n")
    # Nothing inside may wait for a resolver (the containers have no DNS of their own).
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)
    (rootfs / "etc/resolv.conf").write_text("")


def ensure_rootfs(
    packages: tuple[str, ...] = DEFAULT_PACKAGES,
    cache_root: Path = CACHE_ROOT,
    log=print,
) -> Path:
    """Return the cached base root file system for the recipe, building it when missing."""
    rec = recipe(packages)
    final = cache_root / recipe_key(rec)
    rootfs = final / "rootfs"
    if (rootfs / "usr/bin/python3").exists():
        return rootfs
    with _cache_lock(cache_root):
        if (rootfs / "usr/bin/python3").exists():  # another process built it while we waited
            return rootfs
        for stale in cache_root.glob(".build-*"):
            _remove_build_dir(stale)  # under the lock, any build folder is a dead builder's
        build = cache_root / f".build-{final.name}-{os.getpid()}"
        build.mkdir()
        try:
            mirror = debian_mirror(str(rec["suite"]))
            log(f"testbed: debootstrap {rec['suite']} ({rec['variant']}) from {mirror} ...")
            began = time.monotonic()
            with (build / "debootstrap.log").open("w") as out:
                done = subprocess.run(
                    [
                        "debootstrap",
                        f"--variant={rec['variant']}",
                        f"--arch={rec['arch']}",
                        "--include=" + ",".join(rec["include"]),  # type: ignore[arg-type]
                        str(rec["suite"]),
                        str(build / "rootfs"),
                        mirror,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if done.returncode != 0:
                tail = (build / "debootstrap.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"debootstrap failed (exit {done.returncode}):\n{tail}")
            _post_process(build / "rootfs")
            (build / "recipe.json").write_text(json.dumps(rec, indent=1, sort_keys=True))
            build.rename(final)
            log(
                f"testbed: base root file system ready in {time.monotonic() - began:.0f} s: {final}"
            )
        except BaseException:
            _remove_build_dir(build)
            raise
    return rootfs


SHIFT = 100000  # Proxmox's default map for unprivileged containers: u/g 0 100000 65536


def _shift_owners(root: Path, by: int) -> None:
    """lchown every entry (each inode once: hard links share it) by `by`, keeping mode bits
    (chown clears setuid/setgid, which su and mount need)."""
    seen: set[tuple[int, int]] = set()

    def shift(path: str) -> None:
        info = os.lstat(path)
        if (info.st_dev, info.st_ino) in seen:
            return
        seen.add((info.st_dev, info.st_ino))
        os.lchown(path, info.st_uid + by, info.st_gid + by)
        if not stat.S_ISLNK(info.st_mode):
            os.chmod(path, stat.S_IMODE(info.st_mode))

    shift(str(root))
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            shift(os.path.join(folder, name))


def ensure_shifted_rootfs(base: Path, log=print) -> Path:
    """A copy of the base root file system owned by uid/gid 100000+, the shared lower layer of
    every unprivileged container (cached next to the base; ~2 s to build)."""
    shifted = base.parent / f"rootfs-shifted-{SHIFT}"
    if (shifted / "usr/bin/python3").exists():
        return shifted
    with _cache_lock(base.parent.parent):
        if (shifted / "usr/bin/python3").exists():
            return shifted
        build = base.parent / f".shift-{os.getpid()}"
        _remove_build_dir(build)
        try:
            subprocess.run(["cp", "-a", str(base), str(build)], check=True, capture_output=True)
            _shift_owners(build, SHIFT)
            build.rename(shifted)
        except BaseException:
            _remove_build_dir(build)
            raise
        log(f"testbed: unprivileged base (owners +{SHIFT}) ready: {shifted}")
    return shifted
