"""The one rule for the trainer (module_utils/dflash_plan.py trainer_plan): keep the trainer that
trainer.json names when it runs this tree from this run.sh, trains and reads the data that lie
there; else start or restart it, saying why. The no-op decision, the snapshot's changes and the
launch (real run and check mode) all ask it."""

from __future__ import annotations

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_plan import (
    KEEP,
    RESTART,
    START,
    trainer_plan,
)

RECORD = {"pid": 10, "run_id": "r1", "run_sh_sha256": "s1"}
PROCESSES = [{"pid": 10, "job": 10, "state": "S"}, {"pid": 11, "job": 10, "state": "R"}]
STATUS = {"state": "running", "code_tree_sha256": "t1"}


def plan(record=RECORD, processes=PROCESSES, status=STATUS, data_now=None, **kw) -> dict:
    wanted = {"tree_sha256": "t1", "run_sh_sha256": "s1", **kw}
    return trainer_plan(record, processes, status, data_now, **wanted)


def test_the_matching_trainer_is_kept_and_none_is_started():
    assert plan() == {"action": KEEP, "why": []}
    assert plan(processes=[]) == {"action": START, "why": ["no trainer runs"]}
    assert plan(processes=[], restart=True) == {"action": START, "why": ["dflash_restart is set"]}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"restart": True}, "dflash_restart is set"),
        ({"record": None}, "no trainer, or another one than the deployed, runs"),
        ({"processes": [*PROCESSES, {"pid": 20, "job": 20}]},
         "no trainer, or another one than the deployed, runs"),
        ({"processes": [{"pid": 10, "job": 10, "state": "T"}]},
         "the trainer (pid 10) is stopped (SIGSTOP)"),
        ({"run_sh_sha256": "s2"}, "the trainer was started from another run.sh"),
        ({"tree_sha256": "t2"}, "the trainer's status.json names another code tree"),
        ({"status": {**STATUS, "state": "failed"}}, "the trainer's status is failed"),
        ({"status": {}}, "the trainer's status is unknown"),
    ],
)  # fmt: skip
def test_every_reason_to_restart_is_named(change, why):
    found = plan(**change)
    assert found["action"] == RESTART and why in found["why"], found


def test_a_trainer_whose_store_was_prepared_again_is_restarted():
    data = {"kind": "store", "path": "/d", "content_sha256": "a" * 64}
    same = {"kind": "store", "path": "/d", "manifest": {"content_sha256": "a" * 64}, "problems": []}
    status = {**STATUS, "data": data}
    assert plan(status=status, data_now=same)["action"] == KEEP
    other = {**same, "manifest": {"content_sha256": "b" * 64}}
    assert plan(status=status, data_now=other)["why"] == [
        "the trainer's data changed since it started: the store at /d was prepared again "
        "(sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)"
    ]
