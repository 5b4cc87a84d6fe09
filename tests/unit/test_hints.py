"""Fix hints restore what history recorded (module_utils/dflash_hints.py): each names a command
with every value filled in, and none deploys the controller's working tree in place of the
current release; a trainer stopped by stop.yml is the `stopped` verdict, not drift."""

from __future__ import annotations

import importlib.util

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_hints import (
    redeploy_command,
    restart_command,
    stopped_on_purpose,
)
from tests.helpers import REPO


def _filters():
    spec = importlib.util.spec_from_file_location(
        "dflash_hint_filters", REPO / "filter_plugins" / "dflash_verify_findings.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def facts(release: str, ref: str, **trainers) -> dict:
    manifest = {"release": release, "ref": ref, "tree_sha256": "t"}
    return {"current": {"release": release, "manifest": manifest}, "trainers": trainers}


def test_redeploy_builds_the_same_release_id_again():
    assert redeploy_command(facts("v1", "v1")) == "ansible-playbook deploy.yml -e dflash_ref=v1"
    # A g<commit12> release (a branch, or a clean working tree): its commit, not the branch.
    commit = facts("g0123456789ab", "main")
    assert redeploy_command(commit) == "ansible-playbook deploy.yml -e dflash_ref=0123456789ab"
    dirty = redeploy_command(facts("wt-0123456789ab", "WORKTREE"))
    assert "no tag or commit names it" in dirty and "=<" not in dirty.split(", or")[0]


def test_start_again_keeps_the_current_release():
    assert restart_command(facts("v1", "v1")) == (
        "ansible-playbook rollback.yml -e dflash_release=v1"
    )


def test_stopped_on_purpose_is_its_own_verdict_not_drift():
    stopped = facts("v1", "v1", record={"stopped_by": "stop.yml", "stopped_at": "T"})
    assert stopped_on_purpose(stopped) == {
        "by": "stop.yml", "at": "T", "release": "v1",
        "hint": "ansible-playbook rollback.yml -e dflash_release=v1",
    }  # fmt: skip
    filters = _filters()
    assert filters.verify_verdict(stopped, []) == "stopped"
    assert filters.verify_verdict(stopped, [{"kind": "code"}]) == "drift"
    running = facts("v1", "v1", record={"stopped_by": "stop.yml"}, processes=[{"pid": 1}])
    assert stopped_on_purpose(running) is None
    assert filters.verify_verdict(running, []) == "ok"
    [line] = filters.dflash_report_lines([], stopped)
    assert line.startswith("STOPPED: the trainer of release v1 was stopped on purpose")
    assert line.endswith("rollback.yml -e dflash_release=v1")
