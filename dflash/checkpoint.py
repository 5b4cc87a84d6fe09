"""Checkpoints: one file per step, written to a temp name then renamed, so a file under its final
name is complete unless the disk lied; a truncated one is skipped on resume with a warning."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

FORMAT = 1
_NAME = re.compile(r"^step-(\d{8,})\.pt$")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step-{step:08d}.pt"


def save(folder: Path, step: int, payload: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, step)
    temp = folder / f".{final.name}.{os.getpid()}.tmp"
    with temp.open("wb") as handle:
        torch.save({"format": FORMAT, "step": step, **payload}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, final)
    dir_fd = os.open(folder, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def _steps(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def newest_step(folder: Path) -> int | None:
    """The step of the newest checkpoint file in `folder` (not loaded), or None."""
    found = _steps(folder)
    return found[0][0] if found else None


def load_latest(
    folder: Path, warn: Callable[[str], None], mmap: bool = False
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads completely, or None. `mmap` maps the file instead of
    reading it: tensors are read when used (an export reads the weights, never the optimizer)."""
    for step, path in _steps(folder):
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception as exc:  # a truncated zip fails in several ways
            warn(f"skipping checkpoint {path}: cannot be read ({type(exc).__name__}: {exc})")
            continue
        if payload.get("format") != FORMAT or payload.get("step") != step:
            warn(f"skipping checkpoint {path}: not a format-{FORMAT} checkpoint of step {step}")
            continue
        return path, payload
    return None


def prune(folder: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints (0 keeps all)."""
    if keep > 0:
        for _, path in _steps(folder)[keep:]:
            path.unlink(missing_ok=True)
