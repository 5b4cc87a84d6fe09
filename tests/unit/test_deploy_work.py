"""When a deploy is a no-op (module_utils/dflash_plan.py deploy_work): one read of the target
decides, and every difference from what the deploy would make names why the deploy's steps run."""

from __future__ import annotations

import copy

import pytest
from dflash_plan_filters import deploy_work

RUN_SH = "s" * 64
CACHE = "/opt/dflash/cache/c1"
LINE = {"action": "deploy", "result": "healthy", "release": "v1", "tree_sha256": "t1",
        "lock_id": "lock-1", "run_sh_sha256": RUN_SH, "run_id": "r1"}  # fmt: skip
STATE = {
    "root": "/opt/dflash",
    "current": {
        "release": "v1",
        "link": "releases/v1",
        "dangling": False,
        "not_a_link": False,
        "manifest_consistent": True,
    },
    "releases": ["v0", "v1"],
    "release_trees": {"v0": "t0", "v1": "t1"},
    "release_check": {
        "release": "v1",
        "present": True,
        "drift": {"changed": [], "missing": [], "extra": []},
    },
    "stale_temp": [],
    "history": [{**LINE, "release": "v0", "run_id": "r0"}, LINE, {"action": "verify"}],
    "run_sh": {"sha256": RUN_SH},
    "wanted_env": {"lock_id": "lock-1", "exists": True, "drift": []},
    "cache": {"path": CACHE, "exists": True},
    "deploy_lock": {"holder": "this run"},
    "trainers": {
        "record": {"pid": 10, "run_id": "r1", "run_sh_sha256": RUN_SH},
        "processes": [
            {
                "pid": 10,
                "job": 10,
                "state": "S",
                "status": {"state": "running", "code_tree_sha256": "t1"},
            },
            {"pid": 11, "job": 10, "state": "R", "status": None},
        ],
    },
}


def work(state: dict = STATE, **kwargs) -> list[str]:
    args = {"release": "v1", "tree_sha256": "t1", "lock_id": "lock-1",
            "run_sh_sha256": RUN_SH, "cache_dir": CACHE, **kwargs}  # fmt: skip
    return deploy_work(state, **args)


def changed(path: str, value) -> dict:
    """STATE with the value at a dotted path replaced."""
    state = copy.deepcopy(STATE)
    *parents, key = path.split(".")
    node = state
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(key) if isinstance(node, list) else key] = value
    return state


def test_a_target_that_holds_and_runs_this_deploy_is_a_no_op():
    # This run's own deploy lock is in the state (it was read under it): not a reason.
    assert work() == []
    assert work(launch=False) == []


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("current.release", "v0", "current: v0 -> v1"),
        ("current.not_a_link", True, "current is not a link to a release"),
        ("release_check.present", False, "release v1 is not on the target"),
        ("release_check.drift.changed", ["a.py"], "files of release v1 differ from its manifest"),
        ("release_trees.v1", "t9", "release v1 on the target holds another tree"),
        ("current.manifest_consistent", False, "the MANIFEST.json of current was edited"),
        ("stale_temp", ["/opt/dflash/releases/.tmp-1"], "an interrupted run left temporary"),
        ("wanted_env.exists", False, "env lock-1 is missing or has drifted"),
        ("wanted_env.drift", [{"name": "torch"}], "env lock-1 is missing or has drifted"),
        ("run_sh.sha256", "x" * 64, "run.sh on the target differs"),
        ("history.1.lock_id", "lock-0", "history's newest deployment has another lock_id"),
        ("cache.exists", False, f"the compile cache folder {CACHE}"),
        ("cache.path", "/opt/dflash/cache/c0", f"the compile cache folder {CACHE}"),
        ("releases", ["a", "b", "c", "d", "e", "v1"], "more releases than dflash_keep_releases"),
        ("trainers.processes.1.job", 12, "no trainer, or another one than the deployed, runs"),
        ("trainers.processes.1.state", "T", "the trainer (pid 11) is stopped (SIGSTOP)"),
        ("trainers.record.run_sh_sha256", "x", "the trainer was started from another run.sh"),
        ("trainers.processes.0.status.state", "failed", "the trainer's status is failed"),
        ("trainers.processes.0.status.code_tree_sha256", "t0", "names another code tree"),
        ("history.1.run_id", "r0", "history's newest deployment is not this trainer's run"),
    ],
)
def test_each_difference_names_why_the_steps_run(path, value, reason):
    reasons = work(changed(path, value))
    assert len(reasons) >= 1 and any(reason in r for r in reasons), reasons


def test_inputs_that_always_run_the_steps():
    assert work(restart=True) == ["dflash_restart is set"]
    assert work(force_release=True) == ["dflash_force_release is set"]
    assert work(compile_cache="warm") == ["dflash_compile_cache is warm"]
    assert work(job={"name": "j1"}) == ["a job's hosts deploy (and stop, start) together"]
    assert work(interrupted=True) == ["an interrupted run left the deploy lock"]
    assert work(keep=1) == ["more releases than dflash_keep_releases (1) are on the target"]
    assert work(changed("history", [])) == ["history has no deployment"]
    # What this deploy would make differs from what the target has and runs.
    assert "current: v1 -> v2" in work(release="v2")
    assert work(changed("trainers.processes", []), launch=False) == []


def test_a_deploy_over_a_rolled_back_release_names_both_before_it_changes_anything():
    back = changed("history.1.action", "rollback")
    back["history"][1]["time"] = "2026-12-04T10:00:00+00:00"
    [switch] = [r for r in work(back, release="v2", source="ref v2") if r.startswith("current:")]
    assert switch == (
        "current: v1 -> v2 (this replaces v1, which rollback.yml put back at "
        "2026-12-04T10:00:00+00:00, with ref v2)"
    )
    assert "replaces" not in " ".join(work(release="v2"))  # after a plain deploy: no such note


def test_one_reason_per_fact_about_the_release_folder():
    """A release that is not on the target does not also hold 'another tree'."""
    missing = changed("release_check.present", False)
    del missing["release_trees"]["v1"]
    reasons = work(missing)
    assert "release v1 is not on the target" in reasons
    assert not [r for r in reasons if "holds another tree" in r], reasons


VALUES = {"layout": {"mode": "cuda", "target": [0], "drafter": [1]},
          "trainer_args": {"target_model": "tiny", "token_budget": 128},
          "trainer_env": {}, "torchrun_args": []}  # fmt: skip
STORE = {"kind": "store", "path": "/srv/a", "content_sha256": "a" * 64}


def deployed(**values) -> dict:
    """STATE whose current release was deployed with VALUES (and `values` over them) and the
    store STORE, and whose dflash_data reads STORE."""
    state = copy.deepcopy(STATE)
    state["deployment"] = {**LINE, "run_sh": {**VALUES, **values}, "data": STORE}
    state["wanted_data"] = {
        "kind": "store",
        "path": "/srv/a",
        "manifest": {"content_sha256": "a" * 64},
    }
    return state


def test_a_rendered_run_sh_that_differs_names_the_settings_that_changed():
    new_sh = "n" * 64  # these settings render another run.sh
    more = {**VALUES["trainer_args"], "checkpoint_every": 20, "token_budget": 256}
    changed_sh = {**VALUES, "trainer_args": more}
    assert work(deployed(), run_sh_sha256=new_sh, run_sh=changed_sh, launch=False) == [
        "trainer flag --checkpoint-every 20 added",
        "trainer flag --token-budget: 128 -> 256",
        "history's newest deployment has another run_sh_sha256",
    ]
    fewer = {"target_model": "tiny"}
    gpus = {"mode": "cuda", "target": [0], "drafter": [2, 3]}
    reasons = work(deployed(), run_sh_sha256=new_sh,
                   run_sh={**VALUES, "trainer_args": fewer, "layout": gpus})  # fmt: skip
    assert reasons[:2] == [
        "trainer flag --token-budget 128 removed",
        "GPUs: target 0 drafter 1 -> target 0 drafter 2,3",
    ]
    # Another store at the same settings: the data line, with both paths and hashes.
    moved = deployed()
    moved["wanted_data"] = {
        "kind": "store",
        "path": "/srv/b",
        "manifest": {"content_sha256": "b" * 64},
    }
    assert work(moved, run_sh_sha256=new_sh, run_sh=VALUES)[0] == (
        f"data: /srv/a (store {'a' * 12}) -> /srv/b (store {'b' * 12})"
    )
    back = deployed()
    back["wanted_data"] = {"kind": "self_generated"}
    assert work(back, run_sh_sha256=new_sh, run_sh=VALUES)[0] == (
        f"data: /srv/a (store {'a' * 12}) -> self-generated"
    )


def test_a_hand_edited_run_sh_is_named_as_the_file_even_with_the_same_settings():
    edited = deployed()
    edited["run_sh"]["sha256"] = "e" * 64  # the target's file is not the deployed one
    assert work(edited, run_sh=VALUES) == [
        "run.sh on the target differs from the one this deploy renders",
    ]
    # The same settings rendered otherwise (another toolkit): the file, not a setting.
    assert work(deployed(), run_sh_sha256="n" * 64, run_sh=VALUES)[0] == (
        "run.sh on the target differs from the one this deploy renders"
    )
