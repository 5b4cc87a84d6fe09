"""The deployed state of each target as assertions, one concern per test (README.md here).

Everything is read from one dflash_facts document per host (the `state` fixture); the drift
rules are verify.yml's own (filter_plugins/dflash_verify_findings.py), so this suite and
verify.yml agree."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest
import testinfra.host

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_contention import (
    contention_findings,
    contention_view,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_hints import (
    redeploy_command,
    restart_command,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is
from tests.deployed.state import REPO, Target

# A periodic checkpoint is part of a healthy run, starting or warming is not healthy yet: what
# status.json's state means (`stepping`, dflash_states), whatever the release calls it.
STEPPING = "stepping"


def restart(state: Target) -> str:
    """The command that replaces the trainer as its deployment recorded it (verify's hint)."""
    return restart_command(state.facts, restart=True)


def _load_filters(name: str) -> ModuleType:
    # Private names: tests/unit loads the same files under names of its own.
    spec = importlib.util.spec_from_file_location(
        f"dflash_deployed_{name}", REPO / "filter_plugins" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = _load_filters("dflash_verify_findings")
VERIFY = _load_filters("dflash_verify_throughput")
VERIFY_GPU = _load_filters("dflash_verify_gpu")


def says(what: str, expected: Any, found: Any, fix: str) -> str:
    return f"{what}\n  expected: {expected}\n  found:    {found}\n  fix:      {fix}"


def findings(state: Target, *kinds: str) -> list[dict]:
    """verify.yml's findings for this host, only those of the given kinds (all without): the
    same four rule sets as roles/dflash_verify/tasks/main.yml, and its rule for a run in
    progress."""
    found = FILTERS.while_in_progress(
        FILTERS.dflash_findings(state.facts, state.heartbeat_max_age)
        + VERIFY.throughput_findings(
            state.facts, state.min_throughput_ratio, state.heartbeat_max_age
        )
        + VERIFY_GPU.gpu_findings(state.facts)
        + contention_findings(state.facts, state.max_cpu_wait, state.contention_after)
    )
    return [item for item in found if not kinds or item["kind"] in kinds]


def _what(item: dict) -> str:
    if item.get("path") or item.get("package"):
        return item.get("path") or item.get("package")
    if item.get("pid") is not None:
        return f"pid {item['pid']}"
    return f"GPU {item['gpu']}" if item.get("gpu") is not None else ""


def explain(state: Target, items: list[dict]) -> str:
    return "\n".join(
        says(
            f"{state.name}: {item['kind']} {_what(item)}",
            item["expected"],
            item["found"],
            item["hint"],
        )
        for item in items
    )


def current_release(state: Target) -> str:
    release = state.facts["current"]["release"]
    if not release:
        pytest.fail(
            f"{state.name}: no current release (see test_current_release_exists)", pytrace=False
        )
    return release


def deployment(state: Target) -> dict:
    """The history entry that made current what it is: what should be on the target."""
    found = state.facts["deployment"]
    if not found:
        pytest.fail(
            says(
                f"{state.name}: deployment of {current_release(state)}",
                "a history.jsonl entry that deployed the current release",
                "none",
                "current was not set by deploy.yml/rollback.yml; run one of them",
            ),
            pytrace=False,
        )
    return found


def trainer_groups(state: Target) -> list[list[dict]]:
    """The trainer processes of the root, one list per trainer job (torchrun and its workers,
    each in its own session, are one), leader first. A staged deploy (dflash_launch: false)
    expects none."""
    if (state.facts["deployment"] or {}).get("result") == "deployed":
        pytest.skip(f"{state.name}: deployed with dflash_launch: false, no trainer expected")
    groups: dict[int, list[dict]] = {}
    for proc in state.facts["trainers"]["processes"]:
        groups.setdefault(proc["job"], []).append(proc)
    leaders_first = (sorted(group, key=lambda p: p["pid"]) for group in groups.values())
    return sorted(leaders_first, key=lambda group: group[0]["pid"])


def the_trainers(state: Target) -> list[list[dict]]:
    """The trainer groups for the per-trainer checks; none is a failure of its own."""
    release = current_release(state)
    groups = trainer_groups(state)
    if not groups:
        pytest.fail(
            says(
                f"{state.name}: trainer",
                f"a trainer of release {release}",
                "no trainer process",
                f"read runs/latest/train.log, then {restart(state)}",
            ),
            pytrace=False,
        )
    return groups


def status_of(group: list[dict]) -> dict:
    return next((p["status"] for p in group if p.get("status")), None) or {}


def test_target_is_reachable(target: str, deployed: dict[str, Target]) -> None:
    error = deployed[target].error
    assert error is None, says(
        f"{target}: read the state with dflash_facts",
        "an answer",
        error,
        "check that the host (a container: `pct status <vmid>` on its node) is up and its "
        "connection variables in the inventory",
    )


def test_state_root_is_a_folder(state: Target, direct_host: testinfra.host.Host) -> None:
    # Through testinfra's own connection: the root the facts describe is really there.
    root = state.facts["root"]
    assert direct_host.file(root).is_directory, says(
        f"{state.name}: state root",
        f"{root} a folder",
        "missing",
        "deploy.yml creates it (its parent must exist); check dflash_root in the inventory",
    )


def test_current_release_exists(state: Target) -> None:
    assert state.facts["root_exists"], says(
        f"{state.name}: state root",
        f"a deployed state root at {state.facts['root']}",
        "missing",
        "deploy.yml, or set dflash_root in the inventory to where it was deployed",
    )
    current = state.facts["current"]
    assert not current["dangling"], says(
        f"{state.name}: current",
        "current -> a complete release",
        f"current -> {current['link']} (missing or incomplete)",
        "rollback.yml, or deploy.yml",
    )
    assert current["release"], says(
        f"{state.name}: current", "a current release", "no current link", "deploy.yml"
    )


def test_manifest_is_consistent(state: Target) -> None:
    release = current_release(state)
    current = state.facts["current"]
    assert current["manifest_consistent"], says(
        f"{state.name}: releases/{release}/MANIFEST.json",
        "file hashes that add up to its tree_sha256",
        "a manifest edited on the target",
        f"put {release} back: {redeploy_command(state.facts)}",
    )
    recorded = (state.facts["deployment"] or {}).get("tree_sha256")
    tree = current["manifest"].get("tree_sha256")
    assert recorded in (None, tree), says(
        f"{state.name}: tree of release {release}",
        f"{recorded} (history.jsonl)",
        tree,
        f"release {release} was replaced on the target; put it back: "
        f"{redeploy_command(state.facts)}",
    )


def test_files_match_manifest(state: Target) -> None:
    current_release(state)
    problems = findings(state, "code")
    assert not problems, explain(state, problems)


def test_one_trainer_process_group(state: Target) -> None:
    groups = trainer_groups(state)
    pids = [group[0]["pid"] for group in groups]
    assert len(groups) == 1, says(
        f"{state.name}: trainers",
        "one trainer process group",
        f"{len(groups)} trainers: pids {pids}" if groups else "no trainer process",
        f"{restart(state)} stops every trainer of the root and starts one"
        if groups
        else f"read runs/latest/train.log, then {restart(state)}",
    )


def test_trainer_runs_current_release(state: Target) -> None:
    groups = the_trainers(state)
    release = state.facts["current"]["release"]
    tree = state.facts["current"]["manifest"].get("tree_sha256")
    problems = []
    for group in groups:
        leader, runs = group[0], status_of(group).get("code_tree_sha256")
        if leader["release"] != release or runs != tree:
            problems.append(
                says(
                    f"{state.name}: trainer pid {leader['pid']} (since {leader['started_at']})",
                    f"code of release {release} (tree {tree})",
                    f"release {leader['release']} (tree {runs or 'unknown: no status.json'})",
                    f"{restart(state)} replaces it",
                )
            )
    assert not problems, "\n".join(problems)


def test_trainer_heartbeat_is_fresh(state: Target) -> None:
    limit = state.heartbeat_max_age
    problems = []
    for group in the_trainers(state):
        age = next((p["heartbeat_age_s"] for p in group if p["heartbeat_age_s"] is not None), None)
        if age is None or age > limit:
            problems.append(
                says(
                    f"{state.name}: heartbeat of trainer pid {group[0]['pid']}",
                    f"status.json updated within {limit:g} s (dflash_heartbeat_max_age)",
                    "no status.json" if age is None else f"last update {age:g} s ago",
                    f"the trainer hangs: read its train.log, then {restart(state)}",
                )
            )
    assert not problems, "\n".join(problems)


def test_trainer_state_is_running(state: Target) -> None:
    problems = []
    for group in the_trainers(state):
        status = status_of(group)
        if not state_is(status, STEPPING):
            problems.append(
                says(
                    f"{state.name}: state of trainer pid {group[0]['pid']}",
                    "a state that steps (state_is: stepping, as running and checkpointing do)",
                    f"{status.get('state', 'no status.json')} at step {status.get('step')}",
                    f"read runs/{group[0]['run_id']}/train.log, then {restart(state)}",
                )
            )
    assert not problems, "\n".join(problems)


def test_environment_matches_lock(state: Target) -> None:
    lock_id = deployment(state).get("lock_id")
    env = state.facts["environment"] or {}
    assert env.get("exists"), says(
        f"{state.name}: environment",
        f"envs/{lock_id} holding the locked wheels",
        "missing" if env else "no lock_id in the deployment's history entry",
        f"build it again from the lock as recorded: {restart_command(state.facts)}",
    )
    problems = findings(state, "environment")
    assert not problems, explain(state, problems)


def test_run_sh_is_as_deployed(state: Target) -> None:
    expected = deployment(state).get("run_sh_sha256")
    run_sh = state.facts["run_sh"]
    assert run_sh["sha256"] == expected, says(
        f"{state.name}: {run_sh['path']} (sha256)",
        f"{expected} (history.jsonl)",
        "; ".join(state.facts.get("run_sh_changes") or []) or run_sh["sha256"] or "missing",
        f"run.sh was edited on the target; put it back as recorded: {restart_command(state.facts)}",
    )


def test_compile_cache_is_this_builds(state: Target) -> None:
    recorded = (deployment(state).get("run_sh") or {}).get("cache_dir")
    cache = state.facts["cache"] or {}
    assert cache.get("exists"), says(
        f"{state.name}: compile cache",
        f"{recorded} (the cache dir run.sh exports)",
        "missing" if cache else "no cache_dir in the deployment's history entry",
        "deploy.yml creates it again",
    )
    problems = findings(state, "cache")
    assert not problems, explain(state, problems)


def test_trainer_throughput_within_ratio(state: Target) -> None:
    # What verify.yml judges: the last 3 windows of steps against the health check and the
    # fastest comparable deployment; what it cannot judge (too early, no figure) skips.
    view = VERIFY.throughput_view(state.facts, state.min_throughput_ratio, state.heartbeat_max_age)
    if not view["judged"]:
        pytest.skip(f"{state.name}: throughput not judged: {view['note']}")
    problems = findings(state, "throughput")
    assert not problems, explain(state, problems)


def test_trainer_not_starved_of_cpu(state: Target) -> None:
    # What verify.yml judges: the share of its time the trainer waited for a CPU that other
    # processes held, in each of its last 3 windows, once it has run long enough.
    view = contention_view(state.facts, state.max_cpu_wait, state.contention_after)
    if not view["judged"]:
        pytest.skip(f"{state.name}: CPU wait not judged: {view['note']}")
    problems = findings(state, "contention")
    assert not problems, explain(state, problems)


def test_trainer_reads_the_data_that_lie_there(state: Target) -> None:
    # The store (or JSONL file) at the path the trainer reported is still what it read at
    # start; self-generated data have no path to change under it.
    problems = findings(state, "data")
    assert not problems, explain(state, problems)


def test_no_foreign_gpu_process(state: Target) -> None:
    # Every GPU of the layout there, held by this job's processes only (and memory by live
    # ones); a target without nvidia-smi (CPU) skips, saying so.
    view = VERIFY_GPU.judge_facts(state.facts)
    if not view["applies"]:
        pytest.skip(f"{state.name}: gpu check not applicable: {view['why']}")
    problems = findings(state, "gpu")
    assert not problems, explain(state, problems)


def test_last_deployment_is_current_and_healthy(state: Target) -> None:
    release = current_release(state)
    # Export lines (export.yml) record a drafter leaving, not a deployment.
    deployments = [e for e in state.facts["history"] if e.get("action") != "export"]
    last = deployments[-1] if deployments else {}
    # `deployed` is the good end of a staged deploy (dflash_launch: false).
    assert last.get("release") == release and last.get("result") in ("healthy", "deployed"), says(
        f"{state.name}: last deployment in history.jsonl",
        f"release {release}, result healthy",
        f"release {last.get('release')}, result {last.get('result')}" if last else "no history",
        "current was switched outside deploy.yml/rollback.yml, or the last deploy failed: "
        "read its `error`, then deploy.yml or rollback.yml",
    )


def test_verify_finds_no_drift(state: Target) -> None:
    # Every rule of verify.yml, including any added after the tests above were written.
    problems = findings(state)
    assert not problems, explain(state, problems)
