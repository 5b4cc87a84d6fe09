"""Rollback target and keep-N decisions follow history.jsonl, never file dates."""

from __future__ import annotations

from ansible.module_utils.dflash_state import previous_deployment, releases_to_prune


def entry(release: str, result: str = "deployed", action: str = "deploy") -> dict:
    return {"release": release, "result": result, "action": action}


def test_previous_deployment_follows_history_and_skips_current():
    history = [entry("v1"), entry("v2"), entry("v3")]
    assert previous_deployment(history, "v3", ["v1", "v2", "v3"]) == "v2"
    # After a rollback to v1, the previous deployment is v3 (the one it replaced).
    history.append(entry("v1", action="rollback"))
    assert previous_deployment(history, "v1", ["v1", "v2", "v3"]) == "v3"


def test_previous_deployment_skips_failed_and_missing_releases():
    history = [entry("v1"), entry("v2", result="failed"), entry("v3"), entry("v4")]
    assert previous_deployment(history, "v4", ["v1", "v2", "v4"]) == "v1"
    assert previous_deployment([entry("v1")], "v1", ["v1"]) is None


def test_prune_keeps_recent_good_ones_and_protected():
    history = [entry(v) for v in ("v1", "v2", "v3", "v4")]
    available = ["v0-never-deployed", "v1", "v2", "v3", "v4"]
    assert releases_to_prune(history, available, keep=2, protected={"v4"}) == [
        "v0-never-deployed",
        "v1",
        "v2",
    ]
    assert releases_to_prune(history, available, keep=1, protected={"v4", "v1"}) == [
        "v0-never-deployed",
        "v2",
        "v3",
    ]


def test_prune_counts_a_redeployed_release_once_by_its_newest_use():
    history = [entry("v1"), entry("v2"), entry("v1", action="rollback")]
    assert releases_to_prune(history, ["v1", "v2"], keep=1, protected=set()) == ["v2"]
