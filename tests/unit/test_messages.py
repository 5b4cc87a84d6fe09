"""Messages name only what happened: the lists that have members, the real exit code or
signal, what status.json said (never 'None')."""

from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_health import (
    ended,
    speed_text,
    throughput_problem,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import stop_summary


def test_stop_summary_names_only_what_happened():
    assert stop_summary({"terminated": [9318], "killed": []}) == "pid 9318 stopped on SIGTERM"
    both = stop_summary({"terminated": [1, 2], "killed": [3]})
    assert both == "pid 1, 2 stopped on SIGTERM; pid 3 killed (SIGKILL) after the stop timeout"
    lost = stop_summary(
        {"killed": [3], "lost_steps": [{"pid": 3, "step": 80, "checkpoint_step": 12, "lost": 68}]}
    )
    assert lost.endswith("pid 3 was at step 80, its last checkpoint at step 12: 68 steps lost")
    assert "[]" not in both and stop_summary({}) == ""


def test_how_a_trainer_ended_in_words():
    assert ended(1, {}) == "exited with code 1; no status.json written"
    assert ended(-9, {"state": "running"}) == "killed by signal 9; status.json: state running"
    failed = ended(None, {"state": "failed", "error": "OOM"})
    assert failed == (
        "status.json says failed while its process still ran; status.json: state failed, error: OOM"
    )
    gone = ended("its process is gone (exit code unknown)", {})
    assert gone == "its process is gone (exit code unknown); no status.json written"
    assert "None" not in " ".join([failed, gone, ended(0, {"state": None})])


def test_the_gate_compares_the_figure_without_the_wait_for_a_cpu_and_the_floor_as_measured():
    params = {"min_tokens_per_s": 0, "min_throughput_ratio": 0.5,
              "baseline_tokens_per_s": 1000.0, "baseline_name": "the median of 3"}  # fmt: skip
    # A third as measured on a busy host, as fast as before once the wait is left out: kept.
    assert throughput_problem(params, 330.0, 990.0) is None
    # Slow without waiting (a stopped or slower trainer): rolled back, both figures named.
    assert throughput_problem(params, 330.0, 340.0) == (
        "throughput gate: 340.0 tokens/s is under 0.5 x 1000.0 tokens/s of the median of 3 = "
        "500.0 (dflash_min_throughput_ratio)"
    )
    assert throughput_problem(params, 200.0, 400.0) == (
        "throughput gate: 400.0 tokens/s with its wait for a CPU left out (200.0 as measured) "
        "is under 0.5 x 1000.0 tokens/s of the median of 3 = 500.0 (dflash_min_throughput_ratio)"
    )
    # An older trainer gives no unstarved figure: judged as measured.
    assert throughput_problem(params, 330.0) is not None
    # The floor is the user's on real tokens/s: a busy host under it fails it.
    floored = dict(params, min_tokens_per_s=500.0)
    assert "under the floor of 500" in throughput_problem(floored, 330.0, 990.0)


def test_a_healthy_trainer_on_a_busy_host_is_shown_with_both_figures():
    """The deploy's "healthy at step N" names the figure verify will show for that health
    check (the wait for a CPU left out) beside the one measured, when they differ."""
    busy = {"tokens_per_s": 1578.7, "unstarved_tokens_per_s": 2534.2}
    assert speed_text(busy) == (
        "1578.7 tokens/s (2534.2 with its wait for a CPU left out: a busy host)"
    )
    assert speed_text({"tokens_per_s": 1000.0, "unstarved_tokens_per_s": 1020.0}) == (
        "1000.0 tokens/s"
    )
    assert speed_text({"tokens_per_s": 1000.0}) == "1000.0 tokens/s"
