"""Rollback target and keep-N decisions follow history.jsonl, never file dates."""

from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    previous_deployment,
    releases_to_prune,
    unknown_releases,
)


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


def test_prune_keeps_recent_good_ones_protected_and_those_history_does_not_name():
    history = [entry(v) for v in ("v1", "v2", "v3", "v4")]
    available = ["v0-never-recorded", "v1", "v2", "v3", "v4"]
    assert releases_to_prune(history, available, keep=2, protected={"v4"}) == ["v1", "v2"]
    assert releases_to_prune(history, available, keep=1, protected={"v4", "v1"}) == ["v2", "v3"]
    assert unknown_releases(history, available) == ["v0-never-recorded"]


def test_a_lost_history_prunes_nothing_it_does_not_name():
    """history.jsonl deleted under five releases: the next record's line is all it holds."""
    available = ["g86dd644dd745", "v1", "v2", "v3", "vcrash"]
    history = [entry("v3")]
    assert releases_to_prune(history, available, keep=1, protected={"v3"}) == []
    assert unknown_releases(history, available) == ["g86dd644dd745", "v1", "v2", "vcrash"]


def test_prune_counts_a_redeployed_release_once_by_its_newest_use():
    history = [entry("v1"), entry("v2"), entry("v1", action="rollback")]
    assert releases_to_prune(history, ["v1", "v2"], keep=1, protected=set()) == ["v2"]


def line(release: str, run_id: str | None, action: str = "deploy", result: str = "healthy"):
    return {"release": release, "tree_sha256": f"tree-{release}", "run_sh_sha256": "run",
            "lock_id": "lock", "run_id": run_id, "action": action, "result": result}  # fmt: skip


def test_a_deployment_is_recorded_once_against_the_newest_deployment_line():
    from ansible_collections.dflash.deploy.plugins.module_utils.dflash_record import (
        already_recorded,
    )

    history = [line("v1", "r1")]
    # The launch wrote it; the record step (or a rerun that adopted the run) writes no second.
    assert already_recorded(history, line("v1", "r1"))
    assert not already_recorded(history, line("v1", "r2"))  # a restarted trainer: a new run
    # A failed deploy or an export after it does not hide it.
    history += [line("crash", None, result="rolled_back"), line("v1", None, action="export")]
    assert already_recorded(history, line("v1", "r1", action="rollback"))
    # v2 staged (no trainer of its own), then a rollback to v1 whose run r1 still trains: r1
    # was recorded before, but the newest line says v2, so the rollback is a new line.
    history.append(line("v2", None, result="deployed"))
    assert already_recorded(history, line("v2", None, result="deployed"))
    assert not already_recorded(history, line("v1", "r1", action="rollback"))
    # A failed result is never "already recorded" (it is written as it happens).
    assert not already_recorded(history, line("v2", None, result="failed"))
    assert not already_recorded([], line("v1", "r1"))


def test_a_run_adopted_without_its_lock_id_is_not_recorded_again_by_the_next_deploy():
    """History lost the deploy line (torn, moved aside); the repair's rollback adopted the run
    with no lock id to copy. A plain redeploy of the same run writes no second line (the soak
    found one: history listed the one run twice)."""
    from ansible_collections.dflash.deploy.plugins.module_utils.dflash_record import (
        already_recorded,
    )

    adopted = {**line("v1", "r1", action="rollback"), "lock_id": None}
    assert already_recorded([adopted], line("v1", "r1"))
    assert not already_recorded([adopted], line("v1", "r2"))  # another run: another env maybe
    # Known on both sides, a different lock is a different deployment, the same run or not.
    assert not already_recorded([line("v1", "r1")], {**line("v1", "r1"), "lock_id": "other"})
