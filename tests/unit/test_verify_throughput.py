"""verify's `throughput` finding and the per-host figures
(filter_plugins/dflash_verify_throughput.py), from facts documents shaped as dflash_facts
returns them."""

from __future__ import annotations

import copy

from dflash_verify_filters import (
    band,
    grown_stage,
    throughput_findings,
    throughput_view,
    verify_summary,
    verify_summary_lines,
)

TREE = "t" * 64
STAGES_THEN = {"target_forward": 0.02, "drafter_forward": 0.06, "drafter_backward": 0.10,
               "optimizer": 0.01, "step": 0.19}  # fmt: skip


def ref(number: int, release: str, speed: float, current: bool = False) -> dict:
    return {"number": number, "release": release, "action": "deploy", "tokens_per_s": speed,
            "time": f"2026-12-01T10:0{number}:00+00:00", "stages": STAGES_THEN,
            "current": current}  # fmt: skip


def facts(now: float, health_check: float = 1000.0, fastest: dict | None = None,
          **status: object) -> dict:  # fmt: skip
    """A host whose one trainer runs current at `now` tokens/s over a full window."""
    state = {"run_id": "r1", "state": "running", "code_tree_sha256": TREE, "step": 400,
             "tokens_per_s": now, "throughput_window": {"steps": 20, "size": 20},
             "stages": dict(STAGES_THEN, drafter_backward=1.9, step=2.0)}  # fmt: skip
    state.update(status)
    check = ref(2, "v2", health_check)
    return {
        "current": {"release": "v2", "manifest": {"tree_sha256": TREE}},
        "deployment": {"release": "v2", "run_sh": {"layout": {"mode": "cpu"}}},
        "throughput_references": {
            "health_check": check,
            "fastest": fastest or dict(check, current=True),
        },
        "trainers": {
            "record": {"pid": 4242, "run_id": "r1"},
            "processes": [
                {
                    "pid": 4242,
                    "pgid": 4242,
                    "job": 4242,
                    "status": state,
                    "heartbeat_age_s": 1.5,
                    "age_s": 300.0,
                    "started_at": "2026-12-01T10:00:00+00:00",
                }
            ],
        },
        "gpu": {"smi": None},
    }


def test_a_trainer_below_the_ratio_of_its_health_check_is_named_with_both_figures():
    [item] = throughput_findings(facts(now=100.0), 0.8)
    assert item["kind"] == "throughput" and item["pid"] == 4242
    # Both references, with the deployment each came from (here the same one).
    assert item["expected"] == (
        ">= 0.8 x 1000 tokens/s (health check of #2 v2, 2026-12-01T10:02:00+00:00); "
        ">= 0.8 x 1000 tokens/s (fastest of this layout, shape and data: this deployment)"
    )
    assert item["found"] == (
        "100 tokens/s over the last 20 steps at step 400 (x0.1 of the health check, "
        "x0.1 of the fastest)"
    )
    assert item["ratios"] == {"health_check": 0.1, "fastest": 0.1}
    # The stage that grew most since the health check, and the command that shows changes.
    assert "stage drafter_backward grew most: 0.100 -> 1.900 s per step" in item["hint"]
    assert "nothing was deployed since it ran fast" in item["hint"]
    assert item["hint"].endswith("ansible-playbook diff.yml -e dflash_diff_from=fastest")


def test_a_trainer_at_its_health_check_but_below_the_fastest_comparable_is_named():
    fastest = ref(1, "v1", 5000.0)
    [item] = throughput_findings(facts(now=1000.0, fastest=fastest), 0.8)
    expected = "fastest of this layout, shape and data: #1 v1, 2026-12-01T10:01:00+00:00"
    assert expected in item["expected"]
    assert ">= 0.8 x 5000 tokens/s" in item["expected"]
    assert item["ratios"] == {"health_check": 1.0, "fastest": 0.2}
    assert "nothing was deployed" not in item["hint"]
    assert item["fastest"]["release"] == "v1" and item["health_check"]["release"] == "v2"


def test_within_the_ratio_of_both_there_is_no_finding_and_the_view_says_it_judged():
    assert throughput_findings(facts(now=900.0), 0.8) == []
    view = throughput_view(facts(now=900.0), 0.8)
    assert view["judged"] and view["note"] == "judged over the last 20 steps"
    assert view["slowest_stage"] == {"name": "drafter_backward", "seconds": 1.9}


def test_too_early_in_a_run_is_no_drift_and_says_so():
    early = facts(now=1.0, throughput_window={"steps": 7, "size": 20})
    assert throughput_findings(early, 0.8) == []
    view = throughput_view(early, 0.8)
    assert not view["judged"] and view["note"] == "too early to judge: 7 of 20 steps measured"
    assert view["tokens_per_s"] == 1.0 and view["ratios"]["health_check"] == 0.001
    # A trainer from before throughput_window: its steps of this run, the first one left out.
    older = facts(now=1.0, throughput_window=None, step=112, resumed_from_step=100)
    assert throughput_view(older, 0.8)["note"] == "too early to judge: 11 of 20 steps measured"
    assert throughput_findings(facts(now=1.0, throughput_window=None, step=500), 0.8)


def test_nothing_is_judged_that_cannot_be():
    def note(doc: dict, ratio: float = 0.8) -> str:
        assert throughput_findings(doc, ratio) == []
        return throughput_view(doc, ratio)["note"]

    assert note(facts(now=1.0), ratio=0) == "not judged: dflash_verify_min_throughput_ratio is 0"
    assert note(facts(now=1.0, state="warming")) == "the trainer is warming"
    other = facts(now=1.0, code_tree_sha256="o" * 64)
    assert note(other) == "the trainer runs another release than current"
    stale = facts(now=1.0)
    stale["trainers"]["processes"][0]["heartbeat_age_s"] = 95.0
    assert note(stale) == "status.json is 95 s old (heartbeat_stale): not judged"
    unmeasured = facts(now=1.0)
    unmeasured["throughput_references"] = {"health_check": None, "fastest": None}
    assert note(unmeasured) == "no health-check tokens/s recorded for this deployment"
    none = facts(now=1.0)
    none["trainers"]["processes"] = []
    assert note(none) == "no trainer runs"


def test_of_two_trainers_the_one_trainer_json_names_is_judged():
    doc = facts(now=900.0)
    stray = copy.deepcopy(doc["trainers"]["processes"][0])
    stray.update(pid=77, pgid=77, job=77)
    stray["status"].update(run_id="by-hand", tokens_per_s=1.0)
    doc["trainers"]["processes"].insert(0, stray)
    assert throughput_view(doc, 0.8)["tokens_per_s"] == 900.0


def test_the_hint_names_time_outside_the_stages_or_the_slowest_stage_without_a_record():
    then = dict(STAGES_THEN)
    outside = grown_stage(dict(then, step=2.0), then)
    assert outside.startswith("the time went outside the timed stages: a step took 0.19 s")
    assert "2.0 s now" in outside
    assert grown_stage({"drafter_forward": 0.5, "optimizer": 0.1, "step": 0.7}, None) == (
        "slowest stage now: drafter_forward 0.500 s per step (no stages recorded at the "
        "health check)"
    )


def test_the_summary_carries_the_figures_and_what_each_check_looked_at():
    fastest = ref(1, "v1", 1250.0)
    summary = verify_summary(facts(now=100.0, fastest=fastest), 0.8)
    assert summary["trainer"] == {
        "pid": 4242, "run_id": "r1", "state": "running", "state_is": None, "step": 400,
        "started_at": "2026-12-01T10:00:00+00:00", "age_s": 300.0, "heartbeat_age_s": 1.5,
        "job": None,
    }  # fmt: skip
    assert summary["checks"] == {
        "throughput": "judged over the last 20 steps",
        "contention": "not judged: this trainer does not measure its wait for a CPU",
        "gpu": "not applicable: no nvidia-smi on the target (a CPU target)",
    }
    assert summary["gpu"]["applies"] is False
    lines = verify_summary_lines(summary)
    assert lines[0] == ("trainer: pid 4242, running, step 400, up 300.0 s, status.json 1.5 s old")
    assert lines[1] == (
        "tokens/s: now 100 | health check 1000 (#2 v2, x0.1) | fastest 1250 "
        "(#1 v1, x0.08) | slowest stage drafter_backward 1.900 s"
    )
    assert lines[4] == "check gpu: not applicable: no nvidia-smi on the target (a CPU target)"


def test_a_drop_is_drift_only_when_it_holds_over_consecutive_windows():
    """A trainer that writes its windows is judged on the last three: one slow window on a busy
    host is no drift; three in a row are, named with the fastest of them."""
    one_slow = facts(now=500.0, throughput_windows=[980.0, 1010.0, 990.0, 620.0])
    assert throughput_findings(one_slow, 0.8) == []
    assert throughput_view(one_slow, 0.8)["note"] == (
        "judged over the last 3 windows of 20 steps (the fastest window's median step)"
    )
    held = facts(now=500.0, throughput_windows=[990.0, 300.0, 240.0, 250.0])
    [item] = throughput_findings(held, 0.8)
    assert item["found"].startswith("300 tokens/s over the last 3 windows of 20 steps")
    assert item["ratios"]["health_check"] == 0.3
    early = facts(now=1.0, throughput_windows=[1.0, 1.0])
    assert throughput_findings(early, 0.8) == []
    assert throughput_view(early, 0.8)["note"] == "too early to judge: 2 of 3 windows measured"


def test_the_band_widens_with_the_references_own_step_noise_but_never_past_half():
    quiet, noisy, wild = (dict(ref(2, "v2", 1000.0), step_spread=s) for s in (0.01, 0.2, 0.9))
    assert band(0.8, quiet) == 0.8 and band(0.8, None) == 0.8
    assert band(0.8, noisy) == 0.75  # 1 - 1.25 x 0.2
    assert band(0.8, wild) == 0.5
    doc = facts(now=1.0, throughput_windows=[770.0, 760.0, 765.0])
    doc["throughput_references"]["health_check"]["step_spread"] = 0.2
    doc["throughput_references"]["fastest"]["step_spread"] = 0.2
    assert throughput_findings(doc, 0.8) == []  # x0.77, inside the noisy reference's band
    doc["throughput_references"]["health_check"]["step_spread"] = 0.01
    doc["throughput_references"]["fastest"]["step_spread"] = 0.01
    [item] = throughput_findings(doc, 0.8)
    assert item["expected"].startswith(">= 0.8 x 1000 tokens/s")


def test_a_stage_that_shrank_is_never_named_as_the_one_that_grew():
    now = dict(STAGES_THEN, optimizer=0.005, step=0.19)
    hint = grown_stage(now, STAGES_THEN)
    assert "grew most" not in hint and "outside the timed stages" in hint


def test_the_wait_for_a_cpu_is_left_out_of_what_is_judged():
    """Windows as measured at a third of the health check, but the trainer waited for a CPU
    two thirds of the time: a busy host, judged ok with the measured figure named; the same
    windows with no wait (a stopped or slower trainer) are drift."""
    busy = facts(now=330.0, throughput_windows=[330.0, 320.0, 335.0],
                 throughput_windows_unstarved=[990.0, 960.0, 1000.0])  # fmt: skip
    assert throughput_findings(busy, 0.8) == []
    view = throughput_view(busy, 0.8)
    assert view["judged_tokens_per_s"] == 1000.0 and view["measured_tokens_per_s"] == 335.0
    assert view["cpu_wait"] == (
        "335 tokens/s as measured: the trainer waited for a CPU 66% of the time (a busy host), "
        "left out of the 1000 judged"
    )
    assert view["cpu_wait"] in verify_summary_lines(verify_summary(busy, 0.8))
    stopped = facts(now=330.0, throughput_windows=[330.0, 320.0, 335.0],
                    throughput_windows_unstarved=[331.0, 321.0, 336.0])  # fmt: skip
    [item] = throughput_findings(stopped, 0.8)
    assert item["tokens_per_s"] == 336.0 and "waited for a CPU" not in item["found"]
    # A health check on a busy host is compared by its own figure with the wait left out.
    busy_check = copy.deepcopy(busy)
    for key in ("health_check", "fastest"):
        busy_check["throughput_references"][key]["unstarved_tokens_per_s"] = 2000.0
    [item] = throughput_findings(busy_check, 0.8)
    assert item["ratios"]["health_check"] == 0.5
    assert item["expected"].startswith(">= 0.8 x 2000 tokens/s (health check of #2 v2")
    assert item["found"].endswith(
        "; 335 tokens/s as measured: the trainer waited for a CPU 66% of the time (a busy "
        "host), left out of the 1000 judged"
    )
    # The summary names the health check's own figure as measured beside the one it judges by.
    lines = verify_summary_lines(verify_summary(busy_check, 0.8))
    assert "| health check 2000 (#2 v2, 1000 as measured on a busy host, x0.5) |" in lines[1]


def test_windows_of_an_older_trainer_without_unstarved_figures_are_judged_as_measured():
    old = facts(now=300.0, throughput_windows=[300.0, 310.0, 305.0])
    [item] = throughput_findings(old, 0.8)
    assert item["tokens_per_s"] == 310.0
    assert throughput_view(old, 0.8)["cpu_wait"] is None
