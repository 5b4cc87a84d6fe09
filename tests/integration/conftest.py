"""Fixtures for tests that deploy the real trainer to the local target."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, build_wheel

# A test's trainer keeps training in the background while the test goes on (verify, more
# deploys), and on a 2-core machine one trainer training flat out takes a core from the other
# pytest worker. So it trains the smallest step (2 drafter layers, 128 tokens: ~0.06 CPU-s,
# against 0.6 s at the defaults) and sleeps after each (IDLE_STEP_S): ~6% of a core (11% with
# 0.5 s, and a test's trainer idles through most of its test). Tests that judge speed set
# their own sleep.
IDLE_STEP_S = 1.0
# 16 self-generated samples (1 024 tokens): each start generates them anew. No periodic
# checkpoint unless a test asks for one (a stop still writes one): a checkpoint landing in the
# middle of a test's own steps is a second thing happening at once.
TRAINER_ARGS = {
    "target_model": "tiny", "gen_samples": 16, "drafter_layers": 2, "token_budget": 128,
    "checkpoint_every": 1000, "sleep_per_step": IDLE_STEP_S,
}  # fmt: skip


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


def is_trainer(pid: int, root: Path) -> bool:
    """A process of the root's trainer: run.sh's environment marks it with DFLASH_ROOT."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"DFLASH_ROOT={os.path.realpath(root)}".encode() in environ.split(b"\0")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def status_of(root: Path) -> dict:
    return read_json(root / "runs" / "latest" / "status.json") or {}


def add_release(repo: Path, tag: str, path: str, text: str) -> None:
    with open(repo / path, "a") as handle:
        handle.write(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "commit", "-qam", tag], check=True)
    subprocess.run([*git, "tag", tag], check=True)


def tear_last_line(path: Path) -> bytes:
    """Cut history.jsonl's last line in half, as a writer killed mid-write leaves it."""
    text = path.read_bytes()
    start = text.rstrip(b"\n").rfind(b"\n") + 1
    torn = text[start : start + (len(text) - start) // 2]
    path.write_bytes(text[:start] + torn)
    return torn


def write_records(path: Path, seed: int, length: int) -> Path:
    """Samples the tiny target can take (ids below its MASK id, 127): a prompt, a response."""
    rng = np.random.default_rng(seed)
    with path.open("w") as out:
        for _ in range(200):
            ids = rng.integers(0, 127, length).tolist()
            out.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * (length - 8)}))
            out.write("\n")
    return path


# A small package for env tests: a lock of it builds in seconds, torch would take a minute.
PKG = "dflashtest-probe"


@pytest.fixture
def wheelhouse(tmp_path: Path, local_envs: Path) -> Path:
    """Two versions of a tiny self-built package (and pip): env tests without torch."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    for version in ("1.0", "1.1"):
        build_wheel(folder, PKG, version)
    # pip itself, so the env needs no pip (the local_envs fixture filled .build/wheelhouse).
    for pip_wheel in (REPO / ".build" / "wheelhouse").glob("pip-*.whl"):
        shutil.copy(pip_wheel, folder)
    return folder


def small_lock(wheelhouse: Path, version: str = "1.0", **extra) -> dict:
    """A lock of the small wheels, each with its file's sha256 as `make env-lock` records it
    (a pin the wheelhouse lacks gets a hash of nothing: what is tested there is the lack)."""
    lock = {"python": "3.11", "wheels": {PKG: version}, "source": {"wheelhouse": str(wheelhouse)}}
    lock.update(extra)
    if "sha256" not in extra:
        lock["sha256"] = {name: wheel_sha256(wheelhouse, name, pin)
                          for name, pin in lock["wheels"].items()}  # fmt: skip
    return lock


def wheel_sha256(wheelhouse: Path, name: str, version: str) -> str:
    files = sorted(Path(wheelhouse).glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return hashlib.sha256(files[0].read_bytes() if files else b"").hexdigest()
