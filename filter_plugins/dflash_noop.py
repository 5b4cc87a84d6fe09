# A no-op deploy: when one read of the target's state (dflash_facts, in preflight) shows that it
# already holds and runs exactly what this deploy would make, the deploy's steps are skipped
# instead of each step's module being asked in turn over the transport (over pct a module call
# is a `pct exec`). Any doubt names a reason, and then every step runs and decides as before.
from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
)
from dflash_data import changed_under
from dflash_lines import last_deployment
from dflash_procs import TRAINING_STATES, stopped


def _release_work(state: dict[str, Any], release: str, tree_sha256: str) -> list[str]:
    """What the release and activate steps would do: push, unpack again, switch current."""
    current = state.get("current") or {}
    check = state.get("release_check") or {}
    reasons = []
    if current.get("release") != release:
        reasons.append(f"current: {current.get('release') or 'none'} -> {release}")
    if current.get("not_a_link") or current.get("dangling"):
        reasons.append("current is not a link to a release")
    if not check.get("present"):
        reasons.append(f"release {release} is not on the target")
    elif any((check.get("drift") or {}).values()):
        reasons.append(f"files of release {release} differ from its manifest")
    if (state.get("release_trees") or {}).get(release) != tree_sha256:
        reasons.append(f"release {release} on the target holds another tree")
    if current.get("manifest_consistent") is False:
        reasons.append("the MANIFEST.json of current was edited")
    if state.get("stale_temp"):
        reasons.append("an interrupted run left temporary folders")
    return reasons


def _trainer_work(state: dict[str, Any], tree_sha256: str, run_sh_sha256: str) -> list[str]:
    """What the launch step would do: the one recorded trainer runs this tree and run.sh, is
    not stopped, and history's newest deployment line is its run (else it is adopted)."""
    trainers = state.get("trainers") or {}
    record = trainers.get("record") or {}
    processes = trainers.get("processes") or []
    if not record or {p.get("job") for p in processes} != {record.get("pid")}:
        return ["no trainer, or another one than the deployed, runs"]
    if stopped(processes):
        return ["the trainer is stopped (SIGSTOP)"]
    leader = next((p for p in processes if p.get("pid") == record.get("pid")), {})
    status = leader.get("status") or {}
    reasons = []
    if record.get("run_sh_sha256") != run_sh_sha256:
        reasons.append("the trainer was started from another run.sh")
    if status.get("code_tree_sha256") != tree_sha256:
        reasons.append("the trainer's status.json names another code tree")
    if status.get("state") not in TRAINING_STATES:
        reasons.append(f"the trainer's status is {status.get('state') or 'unknown'}")
    data = status.get("data") or {}
    moved = changed_under(data, (state.get("data") or {}).get(str(data.get("path"))))
    if moved:
        reasons.append(f"the trainer's data changed since it started: {moved}")
    last = last_deployment(state.get("history") or []) or {}
    if last.get("run_id") != record.get("run_id"):
        reasons.append("history's newest deployment is not this trainer's run (it is adopted)")
    return reasons


def deploy_work(
    state: dict[str, Any],
    release: str,
    tree_sha256: str,
    lock_id: str,
    run_sh_sha256: str,
    cache_dir: str,
    launch: bool = True,
    restart: bool = False,
    force_release: bool = False,
    compile_cache: str = "keep",
    keep: int = 5,
    job: dict[str, Any] | None = None,
    interrupted: bool = False,
) -> list[str]:
    """Why this deploy's steps must run on the target, one line each; [] for a no-op.

    `state` is preflight's read (dflash_facts with check_release and lock), `run_sh_sha256`
    the hash of run.sh as the runscript step would render it here, `cache_dir` the compile
    cache this build names, `interrupted` whether this run took the deploy lock over from an
    interrupted one (state is read under this run's lock, so no other run changes it). The
    record step adds no line when history's newest deployment has the same identity
    (module_utils/dflash_record.py IDENTITY), which is checked here.
    """
    forced = [
        (job, "a job's hosts deploy (and stop, start) together"),
        (restart, "dflash_restart is set"),
        (force_release, "dflash_force_release is set"),
        (compile_cache != "keep", f"dflash_compile_cache is {compile_cache}"),
        (interrupted, "an interrupted run left the deploy lock"),
    ]
    reasons = [why for when, why in forced if when]
    last = last_deployment(state.get("history") or [])
    if last is None:
        return [*reasons, "history has no deployment"]
    reasons += _release_work(state, release, tree_sha256)
    wanted_env = state.get("wanted_env") or {}
    if not wanted_env.get("exists") or wanted_env.get("drift"):
        reasons.append(f"env {lock_id} is missing or has drifted from its lock")
    if (state.get("run_sh") or {}).get("sha256") != run_sh_sha256:
        reasons.append("run.sh on the target differs from the one this deploy renders")
    identity = {"release": release, "tree_sha256": tree_sha256, "lock_id": lock_id,
                "run_sh_sha256": run_sh_sha256}  # fmt: skip
    reasons += [f"history's newest deployment has another {key}"
                for key, value in identity.items() if last.get(key) != value]  # fmt: skip
    if (
        not os.path.isabs(cache_dir)
        or (state.get("cache") or {}).get("path") != cache_dir
        or not (state.get("cache") or {}).get("exists")
    ):
        reasons.append(f"the compile cache folder {cache_dir} is not the deployed one or missing")
    if len(state.get("releases") or []) > keep:
        reasons.append(f"more releases than dflash_keep_releases ({keep}) are on the target")
    if launch:
        reasons += _trainer_work(state, tree_sha256, run_sh_sha256)
    return reasons


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_deploy_work": deploy_work}
