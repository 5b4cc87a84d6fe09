"""Every bed that is up is recorded in /run/dflash-testbed/<name>.json, so that `down` (or the
next bring-up, for a bed whose pytest process was killed) can stop it by its recorded pids."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REGISTRY = Path(os.environ.get("DFLASH_TESTBED_RUN", "/run/dflash-testbed"))


@contextmanager
def locked() -> Iterator[None]:
    """Serialise VMID allocation between test sessions that bring beds up at the same time."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with (REGISTRY / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def path_for(name: str) -> Path:
    return REGISTRY / f"{name}.json"


def save(name: str, state: dict[str, object]) -> Path:
    REGISTRY.mkdir(parents=True, exist_ok=True)
    path = path_for(name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def load_all() -> dict[str, dict[str, object]]:
    beds = {}
    for path in sorted(REGISTRY.glob("*.json")):
        try:
            beds[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return beds


def remove(name: str) -> None:
    path_for(name).unlink(missing_ok=True)
