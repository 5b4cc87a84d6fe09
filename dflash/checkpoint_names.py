"""Checkpoint files by name, without torch: the supervisor reads what is on disk when it records a
restart, and it imports no torch (dflash/checkpoint.py writes and loads them)."""

from __future__ import annotations

import re
from pathlib import Path

NAME = re.compile(r"^step-(\d{8,})\.pt$")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step-{step:08d}.pt"


def steps(folder: Path) -> list[tuple[int, Path]]:
    """(step, file) of every checkpoint file in `folder` under its final name, newest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.match(p.name))]
    return sorted(found, reverse=True)


def newest_step(folder: Path) -> int | None:
    """The step of the newest checkpoint file in `folder` (not loaded), or None."""
    found = steps(folder)
    return found[0][0] if found else None
