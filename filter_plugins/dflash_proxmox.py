# Filters of the Proxmox steps: what a deploy is about to change on a target, the reason to
# take a snapshot first (a deploy that changes nothing takes none, so that retention never
# pushes out the snapshots from before the last real change).
from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
)
from dflash_procs import TRAINING_STATES


def trainer_runs(state: dict[str, Any], release: str) -> bool:
    """The one trainer the toolkit started runs this release with the run.sh on disk."""
    trainers = state.get("trainers") or {}
    record = trainers.get("record") or {}
    jobs = {p.get("job") for p in trainers.get("processes") or []}
    mine = [p for p in trainers.get("processes") or [] if p.get("pid") == record.get("pid")]
    return bool(
        mine
        and jobs == {record.get("pid")}
        and record.get("release") == release
        and record.get("run_sh_sha256") == (state.get("run_sh") or {}).get("sha256")
        and ((mine[0].get("status") or {}).get("state") in TRAINING_STATES)
    )


def deploy_changes(
    state: dict[str, Any],
    release: str,
    lock_id: str,
    run_sh: dict[str, Any],
    env_changed: bool = False,
    launch: bool = True,
    restart: bool = False,
    compile_cache: str = "keep",
) -> list[str]:
    """What this deploy changes in place, one line each; empty when it changes nothing.

    `state` is the target's facts from before the deploy (dflash_facts), `run_sh` the values
    run.sh will be rendered from (layout, trainer args and env, torchrun args). In doubt it
    names a change: an extra snapshot is cheap, a missing one is not.
    """
    deployment = state.get("deployment") or {}
    current = (state.get("current") or {}).get("release")
    changes = []
    if not deployment:
        changes.append(f"first deployment to {state.get('root')}")
    if release not in (state.get("releases") or []):
        changes.append(f"release {release} is new on the target")
    if current != release:
        changes.append(f"current: {current or 'none'} -> {release}")
    if env_changed:
        changes.append(f"env {lock_id} built")
    if deployment and deployment.get("lock_id") != lock_id:
        changes.append(f"lock: {deployment.get('lock_id')} -> {lock_id}")
    recorded = deployment.get("run_sh") or {}
    changes += [
        f"run.sh {key} changes" for key in sorted(run_sh) if recorded.get(key) != run_sh[key]
    ]
    on_disk = (state.get("run_sh") or {}).get("sha256")
    if deployment and on_disk != deployment.get("run_sh_sha256"):
        changes.append("run.sh differs from the one deployed (it is rewritten)")
    if compile_cache == "clear":
        changes.append("the compile cache is cleared")
    if launch and (restart or not trainer_runs(state, release)):
        changes.append("the trainer is (re)started")
    return changes


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_deploy_changes": deploy_changes}
