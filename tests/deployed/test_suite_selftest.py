"""The deployed-state suite run the way users run it, against a real deploy of the trainer on
the local target: it passes on the clean deploy and names each drift provoked by hand."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.deployed.state import REPO
from tests.deployed.suite_run import TRAINER_TESTS, run_suite
from tests.integration.conftest import alive, deploy  # noqa: F401

pytestmark = [pytest.mark.selftest, pytest.mark.slow]


def local_inventory(path: Path, root: Path) -> Path:
    """inventory/local.yml's host with its own state root; paths the original derives from
    its folder (the wheelhouse) still point into this checkout."""
    text = (REPO / "inventory" / "local.yml").read_text()
    inventory = yaml.safe_load(text.replace("{{ inventory_dir | dirname }}", str(REPO)))
    inventory["all"]["children"]["dflash_targets"]["hosts"]["local"]["dflash_root"] = str(root)
    path.write_text(yaml.safe_dump(inventory))
    return path


def test_suite_passes_on_a_clean_deploy_and_names_each_drift(
    deploy,  # noqa: F811 - the fixture, by name
    target_root: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    run = deploy("v1")
    assert run.rc == 0, run.output
    inventory = local_inventory(tmp_path / "inventory.yml", target_root)

    clean = run_suite(inventory, tmp_path / "clean.xml")
    assert clean.rc == 0 and not clean.failed, clean.output
    # Every check ran (none skipped as for a staged deploy); only this self-test stood aside.
    assert clean.skipped == {request.node.originalname}, clean.output
    assert clean.passed >= TRAINER_TESTS, clean.output
    print(f"deployed-state suite on the local target: {clean.seconds:.1f} s")

    # A hot fix in a deployed file and a hand edit of run.sh, at once.
    train_py = target_root / "current" / "dflash" / "train.py"
    run_sh = target_root / "run.sh"
    originals = {path: path.read_bytes() for path in (train_py, run_sh)}
    train_py.write_bytes(originals[train_py] + b"\n# hot fix\n")
    run_sh.write_bytes(originals[run_sh] + b"# --lr 1 tried by hand\n")
    edited = run_suite(inventory, tmp_path / "edited.xml")
    for path, data in originals.items():
        path.write_bytes(data)
    assert edited.rc != 0
    assert set(edited.failed) == {
        "test_files_match_manifest",
        "test_run_sh_is_as_deployed",
        "test_verify_finds_no_drift",
    }, edited.output
    assert "dflash/train.py" in edited.failed["test_files_match_manifest"]
    assert "edited on the target" in edited.failed["test_files_match_manifest"]
    assert "run.sh" in edited.failed["test_run_sh_is_as_deployed"]

    # The trainer killed (as by the OOM killer): nothing else changed, the edits are undone.
    pid = json.loads((target_root / "trainer.json").read_text())["pid"]
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid), f"trainer pid {pid} survived SIGKILL"
    killed = run_suite(inventory, tmp_path / "killed.xml")
    assert killed.rc != 0
    assert set(killed.failed) == {*TRAINER_TESTS, "test_verify_finds_no_drift"}, killed.output
    assert "no trainer process" in killed.failed["test_one_trainer_process_group"]
    assert {"test_files_match_manifest", "test_run_sh_is_as_deployed"} <= killed.passed
