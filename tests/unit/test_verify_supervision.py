"""What verify makes of the supervisor's record (module_utils/dflash_supervision.py): the
restarts and goodput line, `hung`, and `crash_loop` in place of `not_running`."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from dflash_filters import dflash_findings
from dflash_verify_filters import verify_summary, verify_summary_lines

from ansible_collections.dflash.deploy.plugins.module_utils import dflash_supervision
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_run_spec import (
    RunSpecError,
    supervise_flags,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_supervision import (
    supervision_line,
)

NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    monkeypatch.setattr(dflash_supervision, "time", SimpleNamespace(time=lambda: NOW))


def at(seconds_ago: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).isoformat()


GOODPUT = {"wall_s": 3600.0, "productive_s": 3300.0, "ratio": 0.9167,
           "badput_s": {"startup": 200.0, "checkpoint": 20.0, "lost": 50.0, "hang": 0.0,
                        "down": 30.0}}  # fmt: skip


def supervisor(**overrides) -> dict:
    base = {
        "state": "running", "hang_after_s": 60.0, "last_error": "signal SIGKILL",
        "policy": {"max_restarts": 5, "window_s": 3600.0},
        "restarts": {"count": 1, "last_reason": "signal SIGKILL", "last_at": at(600),
                     "time_to_first_step_s": 12.5},
        "attempts": [{"attempt": 0}, {"attempt": 1}], "goodput": GOODPUT,
    }  # fmt: skip
    base.update(overrides)
    return base


def facts(status: dict | None, record: dict | None, processes: bool = True) -> dict:
    proc = {"pid": 100, "pgid": 100, "job": 100, "run_id": "r1", "status": status,
            "release": "v2", "heartbeat_age_s": 0.5, "age_s": 4000}  # fmt: skip
    return {
        "root": "/opt/dflash", "root_exists": True,
        "current": {"release": "v2", "link": "releases/v2", "dangling": False,
                    "manifest": {"release": "v2", "tree_sha256": "t2"}},
        "files": {"changed": [], "missing": [], "extra": []},
        "history": [{"release": "v2", "tree_sha256": "t2", "result": "healthy"}],
        "deployment": {"release": "v2", "tree_sha256": "t2", "result": "healthy"},
        "trainers": {"record": {"pid": 100, "run_id": "r1"},
                     "processes": [proc] if processes else [], "supervisor": record},
    }  # fmt: skip


def running(last_step_ago: float) -> dict:
    return {"run_id": "r1", "state": "running", "step": 420, "code_tree_sha256": "t2",
            "last_step_at": at(last_step_ago), "step_s_median": 0.5}  # fmt: skip


def test_a_restarted_trainer_is_ok_and_its_restarts_and_goodput_are_shown():
    found = facts(running(1), supervisor())
    assert dflash_findings(found) == []
    lines = verify_summary_lines(verify_summary(found))
    [line] = [x for x in lines if x.startswith("restarts:")]
    assert line.startswith(f"restarts: 1 (last: signal SIGKILL at {at(600)}, first step 12 s")
    assert "| goodput 91.7% of 3600 s: startup 200 s, checkpoint 20 s, lost 50 s" in line
    assert supervision_line(None) is None


def test_no_step_past_the_hang_limit_is_hung_naming_step_and_log():
    [item] = dflash_findings(facts(running(90), supervisor()))
    assert item["kind"] == "hung"
    assert item["expected"] == "a training step within 60 s (dflash_hang_after)"
    assert item["found"] == f"no step for 90 s: step 420 was made at {at(90)}"
    assert "runs/r1/train.log" in item["hint"]
    assert dflash_findings(facts(running(50), supervisor())) == []
    # Warming (compiling) is not judged; without a supervisor the automatic limit applies.
    assert dflash_findings(facts({**running(900), "state": "warming"}, supervisor())) == []
    assert [f["kind"] for f in dflash_findings(facts(running(301), None))] == ["hung"]
    assert dflash_findings(facts(running(299), None)) == []


def test_a_crash_loop_replaces_not_running_with_the_last_error():
    gave_up = supervisor(state="crash_loop", last_error="exit code 1: RuntimeError: CUDA error")
    [item] = dflash_findings(facts(None, gave_up, processes=False))
    assert item["kind"] == "crash_loop"
    assert item["found"] == ("the trainer kept failing: 5 restarts within 3600 s, last: exit code "
                             "1: RuntimeError: CUDA error")  # fmt: skip
    assert "runs/r1/train.log" in item["hint"] and "dflash_restart=true" in item["hint"]
    off = supervisor(state="crash_loop", policy={"max_restarts": 0, "window_s": 3600.0})
    [item] = dflash_findings(facts(None, off, processes=False))
    assert item["found"].startswith("the trainer failed, and restarts are off")
    # Stopped on purpose (stop.yml): not_running, as before.
    stopped = dflash_findings(facts(None, supervisor(state="stopped"), processes=False))
    assert [f["kind"] for f in stopped] == ["not_running"]


# The toolkit's own part; the values of the supervisor's keys are judged by the release
# (tests/unit/test_restart_policy_owner.py).
@pytest.mark.parametrize(
    ("policy", "hang_after", "named"),
    [
        ({"enabled": "yes"}, "auto", "dflash_restart_policy.enabled 'yes'"),
        ("max_restarts=2", "auto", "dflash_restart_policy 'max_restarts=2' must be a mapping"),
    ],
)
def test_bad_restart_settings_are_named(policy, hang_after, named):
    with pytest.raises(RunSpecError, match=named.replace(".", r"\.")):
        supervise_flags(policy, hang_after)


def test_verify_judges_a_hang_by_the_limit_the_supervisor_writes():
    # The limit is the supervisor's own (Policy.hang_limit), as its supervisor.json says it:
    # a release that draws its limit otherwise is followed without an edit here.
    from dflash.supervision.record import Policy

    slow = {**running(0), "step_s_median": 50.0}
    policy = Policy(max_restarts=5, window_s=3600.0, backoff_s=10.0, backoff_max_s=300.0,
                    hang_after_s=None)  # fmt: skip
    limit = policy.hang_limit(slow)
    assert limit == 500.0  # ten slow steps, past the 300 s floor
    record = supervisor(hang_after_s=limit)
    assert dflash_findings(facts({**slow, "last_step_at": at(limit - 10)}, record)) == []
    late = {**slow, "last_step_at": at(limit + 10)}
    assert [f["kind"] for f in dflash_findings(facts(late, record))] == ["hung"]
    # Whether a step is due is what status.json's state_is says, whatever the state's name.
    renamed = {**late, "state": "stepping", "state_is": ["alive", "stepping", "steps_due"]}
    assert [f["kind"] for f in dflash_findings(facts(renamed, record))] == ["hung"]
    saving = {**late, "state_is": ["alive", "training", "stepping"]}
    assert dflash_findings(facts(saving, record)) == []


def test_verify_shows_the_cache_the_trainer_runs_on_and_the_caches_set_aside():
    cache = {
        "dir": "/opt/dflash/cache/3f2a", "fingerprint": "3f2a", "started_warm": True,
        "first_step_s": 24.1, "hits": 46, "misses": 0, "canary": {"ok": True, "step": 3},
    }  # fmt: skip
    found = facts({**running(1), "compile_cache": cache}, supervisor())
    aside = {"name": "3f2a.failed-20261203T010203Z",
             "reason": "compile cache failed its canary: loss is nan"}  # fmt: skip
    found["cache"] = {"path": cache["dir"], "exists": True, "built_by": None,
                      "all": ["3f2a", aside["name"]], "moved_aside": [aside]}  # fmt: skip
    assert dflash_findings(found) == [], "a cache set aside is history, not drift"
    summary = verify_summary(found)
    assert summary["compile_cache"]["hits"] == 46
    [line] = [x for x in verify_summary_lines(summary) if x.startswith("compile cache:")]
    assert line == (
        "compile cache: 3f2a started warm, first step 24.1 s, 46 hits / 0 misses, canary ok; "
        "1 set aside, newest 3f2a.failed-20261203T010203Z "
        "(compile cache failed its canary: loss is nan)"
    )
    cold = {**cache, "started_warm": False, "canary": None, "hits": 0, "misses": 3}
    lines = verify_summary_lines(verify_summary(facts({**running(1), "compile_cache": cold},
                                                      supervisor())))  # fmt: skip
    [line] = [x for x in lines if x.startswith("compile cache:")]
    assert line == ("compile cache: 3f2a started cold, first step 24.1 s, 0 hits / 3 misses, "
                    "no canary (a cold start compiles anew)")  # fmt: skip
    # An older trainer that writes no compile_cache, and no cache set aside: no line at all.
    plain = verify_summary(facts(running(1), supervisor()))
    assert plain["compile_cache"] is None
    assert not [x for x in verify_summary_lines(plain) if x.startswith("compile cache:")]


def test_files_that_differ_from_their_hashes_are_a_cache_finding_and_shown():
    """Issue 51: a kernel's .so damaged in the cache, and verify said `canary ok`."""
    cache = {
        "dir": "/opt/dflash/cache/3f2a", "fingerprint": "3f2a", "started_warm": True,
        "first_step_s": 24.1, "hits": 46, "misses": 0, "canary": {"ok": True, "step": 3},
    }  # fmt: skip
    found = facts({**running(1), "compile_cache": cache}, supervisor())
    damaged = ["24/c244b.so", "e4/ce4.py"]
    found["cache"] = {"path": cache["dir"], "exists": True, "built_by": None, "all": ["3f2a"],
                      "moved_aside": [], "hashes": {"checked": 50, "damaged": damaged,
                                                    "unrecorded": [], "gone": []}}  # fmt: skip
    [item] = dflash_findings(found)
    assert item["kind"] == "cache" and item["path"] == cache["dir"]
    assert item["found"] == "2 file(s) differ from their recorded hashes: 24/c244b.so, e4/ce4.py"
    assert "deploy.yml moves them aside" in item["hint"]
    [line] = [x for x in verify_summary_lines(verify_summary(found))
              if x.startswith("compile cache:")]  # fmt: skip
    assert line.endswith("canary ok; 48 of 50 files as compiled, 2 DAMAGED")
    # Whole again: no finding, the count shown; a release before hashes shows nothing of them.
    found["cache"]["hashes"] = {"checked": 50, "damaged": [], "unrecorded": ["ab/c.so"],
                                "gone": []}  # fmt: skip
    assert dflash_findings(found) == []
    [line] = [x for x in verify_summary_lines(verify_summary(found))
              if x.startswith("compile cache:")]  # fmt: skip
    assert line.endswith("canary ok; 50 of 50 files as compiled, 1 not yet hashed")
    found["cache"]["hashes"] = None
    assert dflash_findings(found) == []
    # An empty folder (a CPU run that compiles nothing): the line says nothing of files.
    found["cache"]["hashes"] = {"checked": 0, "damaged": [], "unrecorded": [], "gone": []}
    [line] = [x for x in verify_summary_lines(verify_summary(found))
              if x.startswith("compile cache:")]  # fmt: skip
    assert line.endswith("canary ok")


def test_a_trainer_in_a_back_off_is_down_not_ok():
    """Issue 51: a crash loop in progress (4 failures, down 2 min) and a restart back-off both
    read `... now backoff ... OK: no drift`, exit 0. Down is a finding: since when, the last
    error, how far into the restart budget, and when the next start comes."""
    waiting = supervisor(
        state="backoff", last_error="exit code 1: RuntimeError: boom",
        restarts={"count": 4, "in_window": 4, "last_reason": "exit code 1", "last_at": at(120),
                  "time_to_first_step_s": None},
        backoff_until=at(-40),
    )  # fmt: skip
    [item] = dflash_findings(facts({**running(130), "state": "failed"}, waiting))
    assert item["kind"] == "trainer_down"
    assert item["found"] == (f"down since {at(120)} (120 s): exit code 1: RuntimeError: boom; "
                             "restart 4 of 5 within 3600 s, the next start in 40 s")  # fmt: skip
    assert "runs/r1/train.log" in item["hint"] and "crash_loop" in item["hint"]
    # Back up and stepping: no finding, the restarts only in the summary line.
    assert dflash_findings(facts(running(1), supervisor())) == []


def test_a_back_off_whose_supervisor_died_is_not_running_not_down():
    waiting = supervisor(state="backoff", backoff_until=at(-40))
    kinds = [f["kind"] for f in dflash_findings(facts(None, waiting, processes=False))]
    assert kinds == ["not_running"]


def test_a_trainer_whose_supervisor_died_is_named_unsupervised():
    """Issue 51: the supervisor died of a full disk, its trainer trained on with ppid 1, and
    verify said nothing of it. Its pid is in supervisor.json; gone from the root's processes
    while it says it supervises, that is a finding."""
    found = facts(running(1), supervisor(pid=99))  # the root's one process is the trainer, 100
    [item] = dflash_findings(found)
    assert item["kind"] == "supervisor_gone"
    assert item["found"].startswith("the supervisor (pid 99) is gone and the trainer (pid 100)")
    assert "runs/r1/train.log" in item["hint"] and "dflash_restart=true" in item["hint"]
    # Alive among the root's processes, stopped on purpose, or an old record without a pid.
    assert dflash_findings(facts(running(1), supervisor(pid=100))) == []
    assert dflash_findings(facts(running(1), supervisor(pid=99, state="stopped"))) == []
    assert dflash_findings(facts(running(1), supervisor())) == []
