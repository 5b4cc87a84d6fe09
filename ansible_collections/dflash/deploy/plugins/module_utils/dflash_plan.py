# What a deploy will do on a target, and why, decided once: from one read of the target's
# state (dflash_facts, before any change) and what the deploy would make (release, tree, env,
# run.sh, cache). deploy.yml's no-op decision, the snapshot step's list of changes, the launch
# (real run and check mode alike) and the messages all ask this module; none decides again.
# Standard library only: the target's modules and the controller's filters use it alike.
from __future__ import annotations

import os

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import (
    changed_under,
    recorded,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import last_deployment
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import stopped
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_settings import setting_changes
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is

KEEP, START, RESTART = "keep", "start", "restart"


def trainer_plan(
    record: dict | None,
    processes: list[dict],
    status: dict | None,
    data_now: dict | None,
    *,
    tree_sha256: str | None,
    run_sh_sha256: str | None,
    restart: bool | str = False,
) -> dict:
    """What the launch does with the trainer, and why: `keep` the one trainer that
    trainer.json names when it runs this tree from this run.sh, is not stopped, trains (its
    status.json) and its data still lie where it read them; else `start` (none runs) or
    `restart`. `processes` are the root's trainer processes (pid, job, ps state), `status` the
    status.json of the run trainer.json names, `data_now` what lies now at its data's path."""
    # `restart` may say why it is set (a release put back after a hand edit).
    why = [restart if isinstance(restart, str) else "dflash_restart is set"] if restart else []
    if not processes:
        return {"action": START, "why": why or ["no trainer runs"]}
    pid = (record or {}).get("pid")
    status = status or {}
    if not record or {p.get("job") for p in processes} != {pid}:
        why.append("no trainer, or another one than the deployed, runs")
    elif stopped(processes):
        pids = ", ".join(map(str, stopped(processes)))
        why.append(f"the trainer (pid {pids}) is stopped (SIGSTOP)")
    else:
        if record.get("run_sh_sha256") != run_sh_sha256:
            why.append("the trainer was started from another run.sh")
        if status.get("code_tree_sha256") != tree_sha256:
            why.append("the trainer's status.json names another code tree")
        if not state_is(status, "training"):
            why.append(f"the trainer's status is {status.get('state') or 'unknown'}")
        moved = changed_under(status.get("data"), data_now)
        if moved:
            why.append(f"the trainer's data changed since it started: {moved}")
    return {"action": RESTART if why else KEEP, "why": why}


def facts_trainer_plan(
    state: dict, tree_sha256: str | None, run_sh_sha256: str | None, restart: bool = False
) -> dict:
    """trainer_plan over a dflash_facts document (preflight's read)."""
    trainers = state.get("trainers") or {}
    record = trainers.get("record") or {}
    processes = trainers.get("processes") or []
    leader = next((p for p in processes if p.get("pid") == record.get("pid")), {})
    status = leader.get("status") or {}
    data_now = (state.get("data") or {}).get(str((status.get("data") or {}).get("path")))
    return trainer_plan(
        record, processes, status, data_now,
        tree_sha256=tree_sha256, run_sh_sha256=run_sh_sha256, restart=restart,
    )  # fmt: skip


def _switch(state: dict, release: str, source: str) -> str:
    """`current: v1 -> v2`, saying so when this replaces a release a rollback put back."""
    now = (state.get("current") or {}).get("release")
    last = last_deployment(state.get("history") or []) or {}
    line = f"current: {now or 'none'} -> {release}"
    if last.get("action") == "rollback" and last.get("release") == now:
        line += (
            f" (this replaces {now}, which rollback.yml put back at {last.get('time')}, with "
            f"{source})"
        )
    return line


def _release_work(state: dict, release: str, tree_sha256: str, source: str) -> list[str]:
    """What the release and activate steps would do: push, unpack again, switch current."""
    current = state.get("current") or {}
    check = state.get("release_check") or {}
    reasons = []
    if current.get("release") != release:
        reasons.append(_switch(state, release, source))
    if current.get("not_a_link") or current.get("dangling"):
        reasons.append("current is not a link to a release")
    if not check.get("present"):
        reasons.append(f"release {release} is not on the target")
    elif any((check.get("drift") or {}).values()):
        reasons.append(f"files of release {release} differ from its manifest")
    elif (state.get("release_trees") or {}).get(release) != tree_sha256:
        reasons.append(f"release {release} on the target holds another tree")
    if current.get("manifest_consistent") is False:
        reasons.append("the MANIFEST.json of current was edited")
    if state.get("stale_temp"):
        reasons.append("an interrupted run left temporary folders")
    return reasons


def _trainer_work(state: dict, tree_sha256: str, run_sh_sha256: str) -> list[str]:
    """Why the launch step would run: the trainer would not be kept, or it is kept but history's
    newest deployment is not its run (it is adopted: health-checked, then recorded)."""
    plan = facts_trainer_plan(state, tree_sha256, run_sh_sha256)
    if plan["action"] != KEEP:
        return plan["why"]
    trainers = state.get("trainers") or {}
    if trainers.get("record_problem"):  # the launch rewrites it, and keeps the trainer
        return [f"{trainers['record_problem']}: trainer.json is rewritten"]
    record = trainers.get("record") or {}
    last = last_deployment(state.get("history") or []) or {}
    if last.get("run_id") != record.get("run_id"):
        return ["history's newest deployment is not this trainer's run (it is adopted)"]
    return []


def _run_sh_work(state: dict, run_sh_sha256: str, run_sh: dict | None) -> list[str]:
    """Why run.sh is rendered again, in the settings a user set (flags, data, GPUs...) where
    they differ from the current release's deployment; a hand edit, or a run.sh rendered
    otherwise from the same settings (another toolkit), as the file itself."""
    on_disk = (state.get("run_sh") or {}).get("sha256")
    if on_disk == run_sh_sha256:
        return []
    deployment = state.get("deployment") or {}
    wanted = {"run_sh": run_sh, "data": recorded(state.get("wanted_data"))}
    named = setting_changes(deployment, wanted) if deployment and run_sh is not None else []
    if not named or on_disk != deployment.get("run_sh_sha256"):
        named.append("run.sh on the target differs from the one this deploy renders")
    return named


def deploy_work(
    state: dict,
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
    job: dict | None = None,
    interrupted: bool = False,
    source: str = "the working tree",
    run_sh: dict | None = None,
) -> list[str]:
    """Why this deploy's steps must run on the target, one line each; [] for a no-op.

    `state` is preflight's read (dflash_facts with check_release and lock), `run_sh_sha256`
    the hash of run.sh as the runscript step would render it here, `cache_dir` the compile
    cache this build names, `interrupted` whether this run took the deploy lock over from an
    interrupted one (state is read under this run's lock, so no other run changes it), `source`
    what the release is built from (`ref v2`, `the working tree of /src`), `run_sh` the values
    run.sh is rendered from (layout, trainer_args, trainer_env, torchrun_args). The
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
    reasons += _release_work(state, release, tree_sha256, source)
    wanted_env = state.get("wanted_env") or {}
    if not wanted_env.get("exists") or wanted_env.get("drift"):
        reasons.append(f"env {lock_id} is missing or has drifted from its lock")
    reasons += _run_sh_work(state, run_sh_sha256, run_sh)
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


def deploy_changes(
    state: dict,
    release: str,
    lock_id: str,
    run_sh: dict,
    tree_sha256: str | None = None,
    run_sh_sha256: str | None = None,
    env_changed: bool = False,
    launch: bool = True,
    restart: bool = False,
    compile_cache: str = "keep",
) -> list[str]:
    """What this deploy changes in place, one line each; empty when it changes nothing (the
    snapshot step's reason to take one).

    `state` is the target's facts from before the deploy (dflash_facts), `run_sh` the values
    run.sh will be rendered from (layout, trainer args and env, torchrun args), `tree_sha256`
    and `run_sh_sha256` the release's tree and the run.sh this deploy renders. In doubt it
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
    if launch:
        plan = facts_trainer_plan(state, tree_sha256, run_sh_sha256, restart)
        if plan["action"] != KEEP:
            changes.append(f"the trainer is {plan['action']}ed: {'; '.join(plan['why'])}")
    return changes
