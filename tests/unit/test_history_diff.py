"""Choosing two deployments from history.jsonl and naming exactly what changed between them."""

from __future__ import annotations

import pytest
from dflash_history_filters import diff_lines, history_lines, restore_target

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_history import (
    SelectorError,
    compare,
    listing,
    select,
)

LOCK = {"python": "3.11", "torch": "2.13.0+cpu", "wheels": {"Jinja2": "3.1.6", "numpy": "2.1.0"}}


def entry(release: str, result: str = "healthy", speed: float | None = 1000.0, **extra) -> dict:
    base = {
        "time": "2026-11-30T12:00:00+00:00",
        "action": "deploy",
        "release": release,
        "tree_sha256": f"tree-{release}",
        "lock_id": "lock-a",
        "lock": LOCK,
        "run_sh_sha256": "sh-a",
        "run_sh": {
            "layout": {"mode": "cpu", "target": [], "drafter": []},
            "trainer_args": {"target_model": "tiny", "max_steps": 100},
            "trainer_env": {},
        },
        "result": result,
        "tokens_per_s": speed,
    }
    base.update(extra)
    return base


HISTORY = [
    entry("v1", speed=900.0),
    entry("v2", speed=1200.0),
    entry("v3", result="rolled_back", speed=300.0, error="tokens/s under the floor"),
    entry("v2", action="rollback", speed=1100.0),
]


def test_selectors_pick_the_documented_deployment():
    assert select(HISTORY, "v2", "current") == 3
    # previous skips the deployments that ran the same code, env and run.sh as current
    assert select(HISTORY, "v2", "previous") == 0
    assert select(HISTORY, "v2", "fastest") == 1
    assert select(HISTORY, "v2", "last") == 3
    assert select(HISTORY, "v2", "3") == 2
    assert select(HISTORY, "v2", "v3") == 2


@pytest.mark.parametrize("selector", ["0", "9", "v9", "current"])
def test_an_unknown_selector_names_the_value_and_the_choices(selector):
    current = "nothing-current" if selector == "current" else "v2"
    with pytest.raises(SelectorError, match=rf"'{selector}'.*previous, fastest"):
        select(HISTORY, current, selector)


def test_previous_sees_a_run_sh_only_change_of_the_same_release():
    history = [entry("v1"), entry("v1", run_sh_sha256="sh-b")]
    assert select(history, "v1", "previous") == 0


def test_diff_names_exactly_the_changed_file_package_and_run_sh_value():
    new_lock = dict(LOCK, wheels={"Jinja2": "3.1.5", "numpy": "2.1.0"})
    old = entry("v1")
    new = entry("v2", lock=new_lock, lock_id="lock-b", speed=500.0)
    new["run_sh"] = dict(old["run_sh"], trainer_args={"target_model": "tiny", "max_steps": 200})
    manifests = {
        "v1": {"tree_sha256": "tree-v1", "files": {"dflash/a.py": "1", "dflash/b.py": "2"}},
        "v2": {"tree_sha256": "tree-v2", "files": {"dflash/a.py": "1", "dflash/b.py": "3"}},
    }
    texts = {("v1", "dflash/b.py"): b"x = 1\n", ("v2", "dflash/b.py"): b"x = 2\n"}
    diff = compare([old, new], 0, 1, manifests, lambda r, p: texts.get((r, p)))
    assert diff["files"]["changed"] == ["dflash/b.py"]
    assert diff["files"]["added"] == diff["files"]["removed"] == []
    assert "-x = 1\n+x = 2" in diff["files"]["text"]["dflash/b.py"]
    named = {(c["section"], c["name"]): (c["from"], c["to"]) for c in diff["changes"]}
    assert named == {
        ("release", "release"): ("v1", "v2"),
        ("release", "tree_sha256"): ("tree-v1", "tree-v2"),
        ("release", "lock_id"): ("lock-a", "lock-b"),
        ("environment", "jinja2"): ("3.1.6", "3.1.5"),
        ("run_sh", "trainer_args.max_steps"): (100, 200),
    }
    assert diff["throughput"] == {"from": 1000.0, "to": 500.0, "ratio": 0.5}
    table = "\n".join(diff_lines(diff))
    assert "jinja2" in table and "trainer_args.max_steps" in table and "x0.5" in table
    assert diff["restarts"] == {"from": [], "to": []} and "restarts" not in table
    # The supervisor's restarts of each side's run (run_id), wherever they lie in history.
    old["run_id"], new["run_id"] = "r1", "r2"
    crash = {"action": "restart", "run_id": "r1", "reason": "signal SIGKILL", "result": "restarted"}
    history = [old, crash, new, {**crash, "run_id": "r2", "reason": "hung"}]
    diff = compare(history, 0, 2, manifests, lambda r, p: texts.get((r, p)))
    assert diff["restarts"] == {"from": ["signal SIGKILL (restarted)"], "to": ["hung (restarted)"]}
    [row] = [x for x in diff_lines(diff) if x.startswith("supervision")]
    assert row.split()[:3] == ["supervision", "restarts", "1,"] and row.endswith("hung (restarted)")


def store_data(sha: str, p50: int, samples: int = 1000, source_sha: str = "s1") -> dict:
    return {
        "kind": "store", "path": "/data/set", "content_sha256": sha, "samples": samples,
        "tokens": samples * p50, "supervised_tokens": samples * p50 // 2,
        "lengths": {"p50": p50, "p90": 2 * p50, "p99": 3 * p50, "max": 3072},
        "sources": [{"name": "a.jsonl", "size": 123, "sha256": source_sha}],
        "settings": {"max_seq_len": 3072, "vocab_size": 151936},
    }  # fmt: skip


def test_diff_shows_what_changed_in_the_data_and_previous_sees_a_data_only_change():
    old = entry("v1", data=store_data("sha-a", 800))
    new = entry("v1", data=store_data("sha-b", 1600, samples=2000, source_sha="s2"), speed=600.0)
    assert select([old, new], "v1", "previous") == 0  # same code, env and run.sh: other data
    diff = compare([old, new], 0, 1, {}, lambda r, p: None)
    named = {(c["section"], c["name"]): (c["from"], c["to"]) for c in diff["changes"]}
    assert named == {
        ("data", "content_sha256"): ("sha-a", "sha-b"),
        ("data", "samples"): (1000, 2000),
        ("data", "tokens"): (800_000, 3_200_000),
        ("data", "supervised_tokens"): (400_000, 1_600_000),
        ("data", "lengths.p50"): (800, 1600),
        ("data", "lengths.p90"): (1600, 3200),
        ("data", "lengths.p99"): (2400, 4800),
        ("data", "sources"): ("a.jsonl s1 (123 B)", "a.jsonl s2 (123 B)"),
    }
    table = "\n".join(diff_lines(diff))
    assert "lengths.p50" in table and "sha-b" in table
    same = compare([old, old], 0, 1, {}, lambda r, p: None)
    assert "same code, environment, run.sh values, GPU layout and data" in diff_lines(same)
    assert listing([old])[0]["data"] == "sha-a"
    assert listing([entry("v1", data={"kind": "self_generated"})])[0]["data"] == "self_generated"


def test_files_of_a_pruned_or_rebuilt_release_are_not_guessed():
    manifests = {"v2": {"tree_sha256": "other-tree", "files": {}}}
    diff = compare([entry("v1"), entry("v2")], 0, 1, manifests, lambda r, p: None)
    assert diff["files"]["known"] is False
    assert "not compared" in "\n".join(diff_lines(diff))


def test_listing_numbers_every_line_and_the_table_shows_results_and_speed():
    rows = listing(HISTORY)
    assert [r["number"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["error"] == "tokens/s under the floor"
    lines = history_lines(rows)
    assert lines[0].split() == [
        "#", "time", "action", "release", "tree", "lock", "layout", "data", "result", "tokens/s",
        "goodput",
    ]  # fmt: skip
    assert "rolled_back" in lines[3] and "300" in lines[3]
    assert history_lines([]) == ["no deployments recorded"]
    # The goodput of a deployment's run (the history module adds it from supervisor.json).
    rows[3].update(goodput={"ratio": 0.9731}, restarts=2)
    assert history_lines(rows)[4].endswith("97.3% (2 restarts)")
    assert history_lines(rows)[1].endswith("-")


def test_a_failed_launch_goes_back_to_the_newest_healthy_deployment_that_is_not_itself():
    releases = ["v1", "v2", "v3"]
    history = [
        entry("v1", run_sh_sha256="a"),
        entry("v2", result="deployed", run_sh_sha256="b"),
        entry("v3", run_sh_sha256="c"),
    ]
    # v4 failed: back to v3, the newest healthy one.
    assert restore_target(history, releases, "v3", "v4", "d")["release"] == "v3"
    # v3 relaunched with the same run.sh failed: that was what ran, so there is nothing to go
    # back to; the older v1 is not swapped in unasked (rollback.yml does that).
    assert restore_target(history, releases, "v3", "v3", "c") == {}
    # But after a rollback.yml to v1 failed (current still v3), v3 comes back.
    assert restore_target(history, releases, "v3", "v1", "a")["release"] == "v3"
    # v3 with a new run.sh failed: v3 with its recorded run.sh.
    assert restore_target(history, releases, "v3", "v3", "x")["run_sh_sha256"] == "c"
    # A pruned release is no target; with no healthy one left, what was current (staged v2).
    assert restore_target(history[1:2], ["v2"], "v2", "v4", "d")["release"] == "v2"
    # Nothing healthy and the current deployment is what failed: nothing to go back to.
    assert restore_target(history[1:2], ["v2"], "v2", "v2", "b") == {}
    assert restore_target([], [], None, "v1", "a") == {}
    # State from before history: the current release alone.
    assert restore_target([], ["v0"], "v0", "v1", "a") == {"release": "v0"}


# The supervisor's lines (dflash/supervision/supervisor.py): the same deployment started again.
RESTARTS = [
    {"time": "2026-11-30T13:05:00+00:00", "action": "restart", "release": "v2",
     "tree_sha256": "tree-v2", "run_id": "r2", "result": result, "reason": "signal SIGKILL",
     "steps_lost": 7}
    for result in ("restarted", "failed", "crash_loop")
]  # fmt: skip


@pytest.mark.parametrize("extra", [[], RESTARTS], ids=["export", "export-and-restarts"])
def test_export_lines_are_listed_but_never_taken_for_a_deployment(extra):
    from dflash_filters import release_findings

    from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
        deployment_index,
        previous_deployment,
        releases_to_prune,
    )

    export = {
        "time": "2026-11-30T13:00:00+00:00", "action": "export", "release": "v2",
        "tree_sha256": "tree-v2", "lock_id": "lock-a", "result": "exported",
        "export": {"name": "v2-step40", "step": 40},
    }  # fmt: skip
    history = [*HISTORY, export, *extra]
    for selector, index in {"current": 3, "previous": 0, "fastest": 1, "last": 3, "v2": 3}.items():
        assert select(history, "v2", selector) == select(HISTORY, "v2", selector) == index
    with pytest.raises(SelectorError, match=r"#5 of history\.jsonl is the export line, not a"):
        select(history, "v2", "5")
    releases = ["v1", "v2", "v3"]
    assert deployment_index(history, "v2") == deployment_index(HISTORY, "v2") == 3
    assert previous_deployment(history, "v2", releases) == "v1"
    assert releases_to_prune(history, releases, 1, {"v2"}) == ["v1", "v3"]
    assert restore_target(history, releases, "v2", "v9", "sh-x")["action"] == "rollback"
    # The line names current with its tree: verify sees no switch outside the toolkit.
    facts = {"root_exists": True, "history": history,
             "current": {"release": "v2", "manifest": {"tree_sha256": "tree-v2"}}}  # fmt: skip
    assert release_findings(facts) == []

    for number in range(len(HISTORY) + 2, len(history) + 1):
        with pytest.raises(SelectorError, match=rf"#{number} .* is the restart line"):
            select(history, "v2", str(number))
    rows = listing(history)[: len(HISTORY) + 1]
    assert (rows[-1]["action"], rows[-1]["result"]) == ("export", "exported")
    assert rows[-1]["export"]["name"] == "v2-step40"
    assert history_lines(rows)[-1].split()[2:4] == ["export", "v2"]
    for row, line in zip(listing(history)[len(rows) :], extra, strict=True):
        assert (row["action"], row["result"], row["release"]) == ("restart", line["result"], "v2")
    for text, line in zip(history_lines(listing(history))[len(rows) + 1 :], extra, strict=True):
        assert f"{line['result']} (signal SIGKILL, 7 steps lost)" in text


def test_one_figure_per_health_check_everywhere_the_measured_one_beside_it():
    """Issue 47: verify and the gate judged a health check by its tokens/s with the trainer's
    wait for a CPU left out (2102), while history, diff and the report showed and compared the
    figure as measured on a busy host (1069). Now all take the one figure and name the other."""
    from ansible_collections.dflash.deploy.plugins.module_utils.dflash_report import drop_candidates

    history = [
        entry("v1", speed=1069.0, unstarved_tokens_per_s=2102.0),  # a busy host
        entry("v2", speed=1500.0),
    ]
    rows = listing(history)
    assert (rows[0]["tokens_per_s"], rows[0]["measured_tokens_per_s"]) == (2102.0, 1069.0)
    assert (rows[1]["tokens_per_s"], rows[1]["measured_tokens_per_s"]) == (1500.0, None)
    lines = history_lines(rows)
    assert any("#1 2102 tokens/s with the trainer's wait for a CPU left out (1069 as measured"
               in line for line in lines), lines  # fmt: skip
    found = compare(history, 0, 1, {}, lambda release, path: None)
    assert found["throughput"] == {"from": 2102.0, "to": 1500.0, "ratio": 0.714}
    assert "2102 tokens/s, 1069 as measured on a busy host)" in diff_lines(found)[0]
    # The report's drop is judged as the gate judges: x0.71 of v1 (x1.4 as measured).
    assert drop_candidates(history, 0.8) == [(1, 0)]
    assert select(history, "v2", "fastest") == 0


def test_a_flag_left_to_its_default_is_no_change():
    """Issue 47: the report listed `target_model tiny -> (none)` as a change where the next
    deployment only left the flag to its default, tiny. The recorded shape fills it in."""
    shape = {"target_model": "tiny", "token_budget": 512, "mode": "cpu", "target_gpus": [],
             "drafter_gpus": [], "nnodes": "1"}  # fmt: skip
    old = entry("v1", shape=shape)
    new = entry("v1", shape=shape)
    new["run_sh"] = dict(new["run_sh"], trainer_args={"max_steps": 100})  # target_model unset
    found = compare([old, new], 0, 1, {}, lambda release, path: None)
    assert [c for c in found["changes"] if c["section"] == "run_sh"] == []
    other = dict(new, shape=dict(shape, target_model="/models/qwen3-8b"))
    found = compare([old, other], 0, 1, {}, lambda release, path: None)
    [change] = [c for c in found["changes"] if c["section"] == "run_sh"]
    assert change["name"] == "trainer_args.target_model", change


def test_a_lock_made_again_with_other_files_of_the_same_versions_is_a_change():
    """A regenerated lock whose versions are the same but whose files are not (a wheel uploaded
    again): the environment section says the wheel files changed, with their short digest."""
    hashed = dict(LOCK, sha256={"torch": "a" * 64, "jinja2": "b" * 64, "numpy": "c" * 64})
    again = dict(hashed, sha256={**hashed["sha256"], "numpy": "d" * 64})
    old, new = entry("v1", lock=hashed), entry("v1", lock=again, lock_id="lock-b")
    diff = compare([old, new], 0, 1, {}, lambda r, p: None)
    [files] = [c for c in diff["changes"] if c["section"] == "environment"]
    assert files["name"] == "wheel files (sha256)" and files["from"] != files["to"]
    assert len(files["from"]) == 12
    same = compare([old, entry("v1", lock=dict(hashed))], 0, 1, {}, lambda r, p: None)
    assert [c for c in same["changes"] if c["section"] == "environment"] == []
    # Other versions are other files: the versions alone are named.
    bumped = dict(again, wheels={**LOCK["wheels"], "numpy": "2.1.1"})
    moved = compare([old, entry("v1", lock=bumped)], 0, 1, {}, lambda r, p: None)
    assert [c["name"] for c in moved["changes"] if c["section"] == "environment"] == ["numpy"]
