"""export.yml on the local target with the real trainer running: the newest checkpoint (or a
named step) is exported on the target, fetched to the controller with files that match its
SHA256SUMS, recorded in history without disturbing verify, keep-N or the trainer; a second run
changes nothing; bad input fails before anything is written."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from tests.deployed.suite_run import run_suite
from tests.deployed.test_suite_selftest import local_inventory
from tests.integration.conftest import TRAINER_ARGS, parent_of, read_json, status_of


def history(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def wait_for_checkpoints(root: Path, count: int, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = sorted(int(p.stem.split("-")[1]) for p in (root / "checkpoints").glob("*.pt"))
        if len(steps) >= count:
            return steps
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} checkpoints in {root / 'checkpoints'}")


def test_export_fetches_a_checked_folder_and_records_it(deploy, playbook, target_root, tmp_path):
    assert deploy("v1", dflash_trainer_args={**TRAINER_ARGS, "checkpoint_every": 2}).rc == 0
    trainer = read_json(target_root / "trainer.json")
    steps = wait_for_checkpoints(target_root, 2)
    exports = tmp_path / "exports"
    lines_before = len(history(target_root))

    # Bad input first: it fails before anything is written on either side.
    bad = playbook("export.yml", dflash_export_dir=str(exports), dflash_export_step=99999)
    assert bad.rc != 0
    assert "has no checkpoint of --step 99999" in bad.output, bad.output
    bad_dtype = playbook("export.yml", dflash_export_dir=str(exports), dflash_export_dtype="fp8")
    assert bad_dtype.rc != 0 and "dflash_export_dtype" in bad_dtype.output
    assert not exports.exists() and not (target_root / "exports").exists()
    assert len(history(target_root)) == lines_before
    # --check: every check runs (the exporter's own with --dry-run), nothing is written.
    check = playbook("export.yml", dflash_export_dir=str(exports), _check=True)
    assert check.rc == 0 and check.changed() >= 1, check.output
    assert not exports.exists() and not (target_root / "exports").exists()
    assert len(history(target_root)) == lines_before

    run = playbook("export.yml", dflash_export_dir=str(exports))
    assert run.rc == 0, run.output
    [name] = [p.name for p in (exports / "local").iterdir()]
    step = int(name.removeprefix("v1-step"))
    assert name == f"v1-step{step}" and step >= steps[-1]
    folder = exports / "local" / name
    listed = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        sha, file_name = line.split("  ")
        listed[file_name] = sha
    assert sorted(listed) == ["config.json", "dflash_export.json", "model.safetensors"]
    for file_name, sha in listed.items():
        assert hashlib.sha256((folder / file_name).read_bytes()).hexdigest() == sha, file_name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 16
    origin = json.loads((folder / "dflash_export.json").read_text())
    assert origin["step"] == step and origin["trained_by"]["run_id"] == trainer["run_id"]
    assert origin["exported_by"]["release"] == "v1"

    # The history line names the export; the trainer ran on untouched.
    line = history(target_root)[-1]
    assert (line["action"], line["result"], line["release"]) == ("export", "exported", "v1")
    assert line["export"]["name"] == name and line["export"]["fetched_to"] == str(folder)
    assert (
        line["export"]["files"]["SHA256SUMS"]
        == hashlib.sha256((folder / "SHA256SUMS").read_bytes()).hexdigest()
    )
    deployment = history(target_root)[-2]
    assert line["lock_id"] == deployment["lock_id"] and "run_sh_text" not in line
    assert read_json(target_root / "trainer.json") == trainer
    status = status_of(target_root)
    assert parent_of(status["pid"]) == trainer["pid"]
    assert status["state"] in ("running", "checkpointing")

    # verify and the deployed-state suite stay ok, history.yml lists the export.
    verify = playbook("verify.yml")
    assert verify.rc == 0, verify.output
    assert verify.report["hosts"]["local"]["verdict"] == "ok"
    # tokens/s on a shared machine is noise: the suite's throughput test is off here, as
    # verify's is in every fixture (this test is about the export, not the speed).
    inventory = local_inventory(
        tmp_path / "inventory.yml",
        target_root,
        dflash_verify_min_throughput_ratio=0,
        dflash_verify_max_cpu_wait=1,
    )
    suite = run_suite(inventory, tmp_path / "s.xml")
    assert suite.rc == 0 and not suite.failed, suite.output
    reports = tmp_path / "reports"
    listed_rows = playbook("history.yml", dflash_history_json=str(reports / "history.json"))
    assert listed_rows.rc == 0, listed_rows.output
    rows = json.loads((reports / "history.json").read_text())["hosts"]["local"]
    assert [(r["action"], r["result"]) for r in rows][-2:] == [
        ("deploy", "healthy"),
        ("export", "exported"),
    ]
    assert rows[-1]["export"]["name"] == name
    # Again, naming the step: it is there on both sides, nothing changes, nothing is recorded.
    again = playbook("export.yml", dflash_export_dir=str(exports), dflash_export_step=step)
    assert again.rc == 0 and again.changed() == 0, again.output
    assert len(history(target_root)) == lines_before + 1
