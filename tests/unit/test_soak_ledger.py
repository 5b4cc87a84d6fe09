"""The soak's schedule and the checks over its ledger (bench/soak_ledger.py): each check finds
the problem it is for, and passes a ledger without it."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from soak_ledger import (
    check,
    false_alarms,
    fault_problems,
    goodput_problem,
    history_problems,
    parse_span,
    schedule,
    summary,
)

SPANS = [("300", 300), ("20s", 20), ("5m", 300), ("1h", 3600), ("3d", 259200), ("1.5h", 5400)]


@pytest.mark.parametrize(("text", "seconds"), SPANS)
def test_spans_read_with_or_without_a_unit(text, seconds):
    assert parse_span(text) == seconds


@pytest.mark.parametrize("text", ["", "1x", "-5m", "0", "h", "5 minutes"])
def test_a_bad_span_is_refused_naming_it_and_the_forms(text):
    with pytest.raises(ValueError, match=r"is no time span: seconds \(300\) or .* 1h, 3d"):
        parse_span(text)


def test_the_schedule_is_the_seeds_and_spaced_by_every():
    kinds = ["kill_trainer", "hang", "rollback"]
    plan = schedule(7, 3600, 120, kinds)
    assert plan == schedule(7, 3600, 120, kinds)  # the same seed, the same faults
    assert plan != schedule(8, 3600, 120, kinds)
    assert [at for at, _ in plan] == [120.0 * i for i in range(1, 31)]
    assert {kind for _, kind in plan} == set(kinds)  # 30 draws of 3: each comes


def fault(kind="kill_trainer", at=100.0, detected=130.0, recovered=140.0, **more):
    return {"kind": kind, "at": at, "bound_s": 60, "expects": ["trainer_down"],
            "detected": detected and {"at": detected, "by": "x"},
            "recovered": recovered and {"at": recovered, "how": "y"}, **more}  # fmt: skip


def test_faults_must_be_detected_and_recovered_within_their_bound():
    assert fault_problems([fault()]) == []
    [late] = fault_problems([fault(recovered=200.0)])
    assert late == "kill_trainer at 100 s: recovered after 100 s, over its bound of 60 s"
    [missed] = fault_problems([fault(detected=None, why="the hint names no command")])
    assert missed == "kill_trainer at 100 s: not detected (the hint names no command)"


def test_steps_lost_must_match_what_the_ledger_saw_and_resume_not_before_the_checkpoint():
    line = {"steps_lost": 7, "resumed_from_step": 20}
    assert fault_problems([fault(restart_line=line, step_at_kill=26, checkpoint_at_kill=20)]) == []
    [told] = fault_problems([fault(restart_line=line, step_at_kill=22, checkpoint_at_kill=20)])
    assert "the restart line says 7 steps lost, the ledger saw 2" in told
    [back] = fault_problems([fault(restart_line=line, step_at_kill=26, checkpoint_at_kill=25)])
    assert "resumed from step 20, before the newest checkpoint 25" in back


def test_time_down_must_match_the_kill_and_the_first_step_the_ledger_saw_within_a_second():
    line = {"steps_lost": 0, "resumed_from_step": 20, "time_to_first_step_s": 7.8}
    timed = {"restart_line": line, "step_at_kill": 20, "killed_wall": 1000.0}
    assert fault_problems([fault(**timed, first_step_wall=1008.5)]) == []
    [told] = fault_problems([fault(**timed, first_step_wall=1009.5)])
    assert "says 7.8 s from the end to the first step, the ledger saw 9.5 s from the kill" in told
    # A hang's restart is timed from the supervisor's kill, which the ledger does not see.
    assert fault_problems([fault("hang", **timed, first_step_wall=1030.0)]) == []


def test_a_finding_without_an_open_fault_to_explain_it_is_a_false_alarm():
    down = {"kind": "kill_trainer", "expects": ["trainer_down"]}
    audits = [
        {"at": 10, "verdict": "ok", "findings": [], "open_faults": []},
        {"at": 20, "verdict": "drift", "findings": ["trainer_down"], "open_faults": [down]},
        {"at": 30, "verdict": "drift", "findings": ["trainer_down", "code"], "open_faults": [down]},
        {"at": 40, "verdict": "drift", "findings": [], "open_faults": []},
    ]
    assert [(a["at"], a["unexplained"]) for a in false_alarms(audits)] == [(30, ["code"]), (40, [])]


def test_a_run_in_progress_is_explained_only_while_one_of_the_soaks_runs_beside_the_audit():
    deploy = ["deploy.yml"]
    audits = [
        # A cron verify beside the soak's deploy: "a deploy is in progress" is the truth.
        {"at": 10, "verdict": "drift", "findings": ["release"], "in_progress": ["release"],
         "open_faults": [], "beside": deploy},
        # The same with nothing of the soak's running: a lock no run holds, a false alarm.
        {"at": 20, "verdict": "drift", "findings": ["release"], "in_progress": ["release"],
         "open_faults": [], "beside": []},
        # Beside a run, a finding that is not "in progress" still needs a fault to explain it.
        {"at": 30, "verdict": "drift", "findings": ["release", "code"], "in_progress": ["release"],
         "open_faults": [], "beside": deploy},
    ]  # fmt: skip
    assert [(a["at"], a["unexplained"]) for a in false_alarms(audits)] == [
        (20, ["release"]), (30, ["code"])
    ]  # fmt: skip


def test_history_lines_must_parse_and_no_deployment_be_recorded_twice():
    deploy = json.dumps({"action": "deploy", "run_id": "r1"})
    restart = json.dumps({"action": "restart", "run_id": "r1"})
    assert history_problems([deploy, restart, restart]) == []
    assert history_problems([deploy, '{"action": "dep']) == [
        'history line 2 is no JSON record: \'{"action": "dep\''
    ]
    assert history_problems([deploy, restart, deploy]) == [
        "history lines 1 and 3 record one deployment (r1) twice"
    ]


def test_goodput_must_add_up_to_the_wall_time():
    good = {"productive_s": 50.0, "badput_s": {"down": 5.0, "hang": 5.0}, "wall_s": 60.0}
    assert goodput_problem(good) is None
    assert "goodput parts 60.0 s against a wall of 70.0 s" in goodput_problem(
        {**good, "wall_s": 70.0}
    )
    assert goodput_problem({}) == "no goodput record"


def test_a_whole_ledger_passes_only_when_every_check_does():
    good = {"productive_s": 50.0, "badput_s": {"down": 10.0}, "wall_s": 60.0}
    ledger = {
        "faults": [fault()], "history": [json.dumps({"action": "deploy", "run_id": "r1"})],
        "audits": [{"at": 10, "verdict": "ok", "findings": [], "open_faults": []}],
        "goodput": {"r1": good}, "end": {"verdict": "ok", "stepping": True},
    }  # fmt: skip
    assert check(ledger) == []
    assert "| kill_trainer | 1 | 1 | 1 | 30/40 |" in summary(ledger)
    assert check({**ledger, "end": {"verdict": "drift", "stepping": True}}) == [
        "the end: {'verdict': 'drift', 'stepping': True}"
    ]
    assert check({**ledger, "goodput": {"r1": {**good, "wall_s": 90.0}}})[0].startswith("run r1: ")
