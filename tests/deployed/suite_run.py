"""Running the deployed-state suite the way users run it (`pytest tests/deployed --inventory
FILE` in a fresh process) and reading which tests passed, skipped and failed, for the suite's
self-test on the local target and for the test bed's containers (tests/proxmox)."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from tests.deployed.state import REPO

SUITE = Path(__file__).parent
TRAINER_TESTS = {
    "test_one_trainer_process_group",
    "test_trainer_runs_current_release",
    "test_trainer_heartbeat_is_fresh",
    "test_trainer_state_is_running",
}


@dataclass
class SuiteRun:
    rc: int
    output: str
    seconds: float
    passed: set[str]
    skipped: set[str]
    failed: dict[str, str]  # test name (without the host parameter) -> its failure texts


def run_suite(inventory: Path, junit: Path, timeout: float = 900) -> SuiteRun:
    """`pytest tests/deployed --inventory FILE` in a fresh process, as in a user's CI."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITE), "--inventory", str(inventory),
         "-p", "no:cacheprovider", "-q", f"--junitxml={junit}"],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    passed: set[str] = set()
    skipped: set[str] = set()
    failed: dict[str, str] = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        # One name per test: the failures of every host are joined under it.
        name = case.get("name", "").split("[")[0]
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            text = f"{problem.get('message')}\n{problem.text}"
            failed[name] = f"{failed[name]}\n{text}" if name in failed else text
        elif case.find("skipped") is not None:
            skipped.add(name)
        else:
            passed.add(name)
    # A test that failed for one host and passed for another counts as failed.
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, seconds, passed - set(failed),
                    skipped - set(failed), failed)  # fmt: skip
