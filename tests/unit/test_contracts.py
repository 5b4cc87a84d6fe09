"""The trainer owns its contracts and its records say what they mean: status.json and
supervisor.json write what their state means (`state_is`), a store's manifest which keys a run
reports and each file's bytes, supervisor.json its hang limit; `python -m dflash.contracts`
publishes them all. The toolkit judges by what the records say, so a release that renames a
state, adds a reported key or an array of another dtype is followed without an edit; records
of releases from before (0.2.0) are read as those releases wrote them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils import dflash_health
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import read_data
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import (
    state_is,
    supervisor_is,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_supervision import (
    supervision_findings,
)
from dflash.data import store_format
from dflash.supervision import record as run_record
from dflash.supervision import states
from dflash.supervision.status import StatusFile
from tests.helpers import REPO


def written(tmp_path: Path, state: str) -> dict:
    """status.json as the trainer's own StatusFile writes it in `state`."""
    path = tmp_path / f"{state}.json"
    StatusFile(path, "r1", interval_s=60).write(state=state)
    return json.loads(path.read_text())


def test_the_trainer_publishes_its_contracts_without_torch():
    out = subprocess.run(
        [sys.executable, "-E", "-s", "-B", "-c",
         "import sys, dflash.contracts as c; c.main(); "
         "assert 'torch' not in sys.modules and 'numpy' not in sys.modules"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    published = json.loads(out.stdout)
    assert published["status"]["states"]["running"] == list(states.STATES["running"])
    assert published["supervisor"]["states"]["backoff"] == list(states.SUPERVISOR_STATES["backoff"])
    assert published["store"]["format"] == store_format.FORMAT
    assert published["store"]["summary_keys"] == list(store_format.SUMMARY_KEYS)
    assert published["store"]["arrays"]["tokens"] == {"file": "tokens.i32", "dtype": "<i4"}
    assert published["supervisor"]["hang_limit_auto"] == {
        "steps": run_record.HANG_STEPS, "floor_s": run_record.HANG_FLOOR_S,
    }  # fmt: skip
    assert {"train", "supervise"} <= set(published["flags"])


def test_every_state_says_what_it_means_and_the_toolkit_judges_by_that(tmp_path):
    for state, meanings in states.STATES.items():
        status = written(tmp_path, state)
        assert status["state_is"] == list(meanings)
        for meaning in states.MEANINGS:
            assert state_is(status, meaning) == (meaning in meanings), (state, meaning)


def test_a_release_that_renames_its_states_is_followed_without_an_edit(tmp_path, monkeypatch):
    renamed = {
        "starting": ("alive",),  # StatusFile starts in it
        "compiling": ("alive", "training"),
        "training": ("alive", "training", "stepping", "steps_due"),
        "saving": ("alive", "training", "stepping"),
        "done": (),
        "error": ("failed",),
    }
    monkeypatch.setattr(states, "STATES", renamed)
    status = {**written(tmp_path, "training"), "step": 3}
    (tmp_path / "status.json").write_text(json.dumps(status))
    # The deploy's health check takes it as trained, by what it says, not by its name.
    healthy = dflash_health.wait_healthy(
        lambda: None, str(tmp_path / "status.json"), str(tmp_path / "train.log"),
        status["code_tree_sha256"], timeout=5, steps=3,
    )  # fmt: skip
    assert healthy["state"] == "training"
    failed = written(tmp_path, "error")
    (tmp_path / "status.json").write_text(json.dumps(failed))
    with pytest.raises(dflash_health.LaunchError, match="failed at start"):
        dflash_health.wait_healthy(
            lambda: None, str(tmp_path / "status.json"), str(tmp_path / "train.log"),
            status["code_tree_sha256"], timeout=5, steps=3,
        )  # fmt: skip


def test_a_supervisor_that_renames_its_back_off_is_followed_without_an_edit(tmp_path, monkeypatch):
    monkeypatch.setattr(
        run_record, "SUPERVISOR_STATES", {**states.SUPERVISOR_STATES, "waiting": ("supervising",
        "not_training", "down")},
    )  # fmt: skip
    policy = run_record.Policy(max_restarts=5, window_s=3600.0, backoff_s=10.0,
                               backoff_max_s=300.0, hang_after_s=None)  # fmt: skip
    record = run_record.RunRecord(policy, tmp_path, "r1")
    record.run_dir.mkdir(parents=True)  # the supervisor's main() makes it
    record.state = "waiting"
    record.save()
    saved = json.loads((tmp_path / "runs" / "r1" / "supervisor.json").read_text())
    assert saved["state_is"] == ["supervising", "not_training", "down"]
    assert supervisor_is(saved, "down") and not supervisor_is(saved, "gave_up")
    supervisor_process = {"pid": saved["pid"], "run_id": "r1", "status": None}
    facts = {"trainers": {"record": {"run_id": "r1"}, "supervisor": saved,
                          "processes": [supervisor_process]}}  # fmt: skip
    assert [f["kind"] for f in supervision_findings(facts)] == ["trainer_down"]


def test_records_from_before_state_is_are_read_as_those_releases_wrote_them():
    old = {"state": "checkpointing"}
    assert state_is(old, "alive") and state_is(old, "stepping")
    assert not state_is(old, "steps_due") and not state_is({"state": "stopped"}, "alive")
    assert state_is({"state": "failed"}, "failed")
    assert supervisor_is({"state": "backoff"}, "down")
    assert supervisor_is({"state": "crash_loop"}, "gave_up")
    assert not supervisor_is({"state": "stopped"}, "supervising")


def prepared(tmp_path: Path) -> Path:
    from dflash.data.prepare import prepare
    from dflash.data.records import Settings

    records = tmp_path / "a.jsonl"
    records.write_text('{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}\n' * 8)
    store = tmp_path / "store"
    prepare([records], store, Settings(64, 128, None), say=lambda _: None)
    return store


def test_a_store_says_what_a_run_reports_of_it_and_each_files_bytes(tmp_path, monkeypatch):
    from dflash.data import store as token_store

    # A release that reports one more key of its manifest (here, how it was prepared).
    monkeypatch.setattr(token_store, "SUMMARY_KEYS", (*store_format.SUMMARY_KEYS, "prepare"))
    store = prepared(tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["summary_keys"][-1] == "prepare"
    found = read_data(str(store))
    assert found["problems"] == [] and found["manifest"]["prepare"] == manifest["prepare"]
    assert (found["format"], found["version"]) == (store_format.FORMAT, store_format.VERSION)
    # An array of a dtype whose name does not end in its item size is judged by its bytes.
    tokens = manifest["arrays"]["tokens"]
    assert tokens["bytes"] == (store / "tokens.i32").stat().st_size
    manifest["arrays"]["tokens"] = {**tokens, "dtype": "<c16", "count": tokens["bytes"] // 16}
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert read_data(str(store))["problems"] == []


def test_a_store_from_before_summary_keys_and_bytes_is_read_as_it_was_written(tmp_path):
    store = prepared(tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    del manifest["summary_keys"]
    for entry in manifest["arrays"].values():
        del entry["bytes"]
    (store / "manifest.json").write_text(json.dumps(manifest))
    found = read_data(str(store))
    assert found["problems"] == []
    assert set(found["manifest"]) == set(store_format.SUMMARY_KEYS) & set(manifest)
    tokens = store / "tokens.i32"
    tokens.write_bytes(tokens.read_bytes()[:-4])
    assert read_data(str(store))["problems"] == [
        f"tokens.i32 holds {tokens.stat().st_size} bytes, its manifest says "
        f"{tokens.stat().st_size + 4}"
    ]
