"""Checkpoints: one file per step, written to a temp name then renamed, so a file under its final
name is complete unless the disk lied; a truncated one is skipped on resume with a warning.

A save the disk has no room for raises CheckpointWriteError and leaves no temp file; the temp
files of writers killed mid-save are removed on the next start."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dflash.checkpoint_names import checkpoint_path, steps

FORMAT = 1
_TEMP = re.compile(r"^\.step-\d{8,}\.pt\.(\d+)\.tmp$")  # save()'s temp name, with the writer's pid
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class CheckpointWriteError(OSError):
    """A checkpoint not written because its file system is full or over quota (errno ENOSPC or
    EDQUOT; filename: the checkpoint it would have been): the trainer trains on."""


def save(folder: Path, step: int, payload: dict[str, Any]) -> Path:
    final = checkpoint_path(folder, step)
    temp = folder / f".{final.name}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with temp.open("wb") as handle:
            torch.save({"format": FORMAT, "step": step, **payload}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, final)
    except Exception as exc:
        temp.unlink(missing_ok=True)  # a partial file only takes space
        code = disk_full(exc)
        if code is None:
            raise
        raise CheckpointWriteError(code, os.strerror(code), str(final)) from exc
    dir_fd = os.open(folder, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def disk_full(exc: BaseException) -> int | None:
    """ENOSPC or EDQUOT when `exc` or an exception it came from says the disk is full, else None.
    torch.save reports a failed write as a RuntimeError whose __context__ is the OSError."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in DISK_FULL:
            return link.errno
        for code in DISK_FULL:
            if os.strerror(code) in str(link):
                return code
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:  # a chain set by hand may loop
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def remove_unfinished(folder: Path) -> list[tuple[Path, int]]:
    """Remove the temp files of writers that no longer run (killed mid-save): (path, pid) of
    each. For the start of a trainer: a temp of its own pid is then a leftover of an earlier
    process with the same pid (in a container a restarted trainer often gets the same one)."""
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        if (match := _TEMP.match(path.name)) and not _runs(pid := int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append((path, pid))
    return removed


def _runs(pid: int) -> bool:
    """Whether another process with this pid runs (it may be writing that checkpoint now)."""
    if pid in (0, os.getpid()):
        return False
    try:
        os.kill(pid, 0)  # signal 0 only asks whether the process exists
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass  # it runs, as another user
    return True


def load_latest(
    folder: Path,
    warn: Callable[[str], None],
    mmap: bool = False,
    skipped: list[dict[str, Any]] | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads completely, or None. `mmap` maps the file instead of
    reading it: tensors are read when used (an export reads the weights, never the optimizer).
    Each newer one skipped is named to `warn` and, given `skipped`, added there as
    {path, step, error}; the file stays (its owner may want it)."""

    def skip(path: Path, step: int, error: str, why: str) -> None:
        warn(f"skipping checkpoint {path}: {why}")
        if skipped is not None:
            skipped.append({"path": str(path), "step": step, "error": error})

    for step, path in steps(folder):
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception as exc:  # a truncated zip fails in several ways
            error = f"{type(exc).__name__}: {exc}"
            skip(path, step, error, f"cannot be read ({error})")
            continue
        if payload.get("format") != FORMAT or payload.get("step") != step:
            error = f"not a format-{FORMAT} checkpoint of step {step}"
            skip(path, step, error, error)
            continue
        return path, payload
    return None


def prune(folder: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints (0 keeps all)."""
    if keep > 0:
        for _, path in steps(folder)[keep:]:
            path.unlink(missing_ok=True)
