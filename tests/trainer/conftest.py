"""Shared helpers for the trainer tests: the repo root, CLI runs, a tiny target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `pytest` (not `python -m pytest`) does not add the repo root
    sys.path.insert(0, str(REPO))


def argv(text: str) -> list[str]:
    """Command-line words from one readable string."""
    return text.split()


# Small, fast settings for CLI runs on a 2-core CPU.
FAST = argv("--target-model tiny --drafter-layers 2 --gen-samples 64 --log-every 1")


def cli_env(pythonpath: Path = REPO) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_module(module: str, *args: str, cwd: Path, timeout: float = 600, **kw: Any):
    """Run `python -m <module> args` to completion; stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=kw.pop("env", cli_env()),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,
    )


def read_status(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for_status(path: Path, predicate, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(path)
        if status is not None and predicate(status):
            return status
        time.sleep(0.05)
    raise AssertionError(f"status {path} never matched; last: {read_status(path)}")


def log_losses(stdout: str) -> dict[int, float]:
    """{step: loss} from the trainer's step lines."""
    losses = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) > 4 and words[1] == "step" and words[3] == "loss":
            losses[int(words[2])] = float(words[4])
    return losses


@pytest.fixture(scope="session")
def tiny_target():
    from dflash.target import load_target

    return load_target("tiny", torch.device("cpu"), num_features=5, mask_token_id=None)


TRAINED_STEPS = 2


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """The checkpoint folder of a short real training run (tiny target, 2 drafter layers,
    run id t1), for the tests that export and read back drafters."""
    folder = tmp_path_factory.mktemp("trained")
    files = ["--checkpoint-dir", str(folder / "ck"), "--status-file", str(folder / "st.json")]
    steps = ["--max-steps", str(TRAINED_STEPS), "--run-id", "t1"]
    result = run_module("dflash.train", *FAST, "--gen-samples", "16", *steps, *files, cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder / "ck"
