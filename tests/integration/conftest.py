"""Fixtures for tests that deploy the real trainer to the local target."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

# Short enough for CPU tests, long enough that the trainer is still running when checked.
TRAINER_ARGS = {"target_model": "tiny", "gen_samples": 64, "checkpoint_every": 50}


@pytest.fixture
def deploy(trainer_repo, playbook):
    """deploy.yml of a ref of trainer_repo with the trainer launched; stop.yml afterwards."""

    def run(ref: str, **extravars):
        extravars.setdefault("dflash_trainer_args", TRAINER_ARGS)
        extravars.setdefault("dflash_launch", True)
        extravars.setdefault("dflash_health_timeout", 180)
        return playbook(
            "deploy.yml", dflash_source_dir=str(trainer_repo), dflash_ref=ref, **extravars
        )

    yield run
    stop = playbook("playbooks/stop.yml", dflash_stop_timeout=20)
    assert stop.rc == 0, stop.output


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def status_of(root: Path) -> dict:
    return read_json(root / "runs" / "latest" / "status.json") or {}


def add_release(repo: Path, tag: str, path: str, text: str) -> None:
    with open(repo / path, "a") as handle:
        handle.write(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "commit", "-qam", tag], check=True)
    subprocess.run([*git, "tag", tag], check=True)
