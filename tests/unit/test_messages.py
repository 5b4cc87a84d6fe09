"""Messages name only what happened: the lists that have members, the real exit code or
signal, what status.json said (never 'None')."""

from __future__ import annotations

from ansible.module_utils.dflash_health import ended
from ansible.module_utils.dflash_procs import stop_summary


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
