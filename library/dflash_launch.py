#!/usr/bin/python
# The last step of a deploy: prove the files, stop every old trainer, start one, prove health.
# Over 300 lines because ~170 are the DOCUMENTATION and RETURN Ansible wants; the code (~290)
# executes module_utils/dflash_plan.py's decision, runs are module_utils/dflash_runs.py's.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_launch
short_description: Start exactly one healthy trainer of the current release
description:
  - Checks every file of C(current) against its manifest (fails with the list unless
    I(force)).
  - Finds every trainer of this state root, from C(trainer.json) and a scan of C(/proc) (the
    C(DFLASH_ROOT) marker that run.sh exports, or a C(dflash.train) whose working folder is
    inside the root), so strays started by hand are found too; stops each with SIGTERM to its
    process group, waits up to I(stop_timeout), then SIGKILL, and confirms none is left.
  - Starts C(run.sh) through setsid into C(runs/<run-id>/) with a fresh C(train.log), points
    C(runs/latest) at it (run.sh runs the trainer under C(dflash.supervise), whose pid
    C(trainer.json) records; stopping it stops its trainer and restarts nothing), and waits
    up to I(health_timeout) for C(status.json) to say C(running) with step >=
    I(health_steps) and the code tree hash of C(current); else fails with the log tail (a
    trainer that ended is a failure at once, also while its supervisor would restart it).
  - "Throughput gate: then fails when the trainer's tokens/s is under I(min_tokens_per_s), or
    under I(min_throughput_ratio) times I(baseline_tokens_per_s); the failure stops the new
    trainer and names both numbers."
  - With I(record), writes the healthy trainer's line to C(history.jsonl) itself, at once, so
    a run killed after this point loses nothing.
  - Idempotent. When the one running trainer already runs the current tree with the current
    run.sh (which names the env and the cache), trains, and its data still lie where it read
    them, nothing is restarted unless I(restart); the rule is module_utils/dflash_plan.py's,
    which deploy.yml's no-op decision asks too. A stopped (SIGSTOP) trainer is restarted. A
    matching trainer that history does not know (an interrupted run started it) is adopted,
    meaning its health is checked and it is recorded.
  - Stopping sends SIGCONT first (a stopped trainer cannot act on SIGTERM), and says how many
    steps past its last checkpoint a trainer killed after the timeout lost.
  - Long waits end when this run's deploy lock is lost (taken over, or its ansible-playbook
    process died where the target can see it, or, with I(poll_timeout_s), no task of its play
    reached the target for that long), so they never outlive the play. The same is checked
    again right before the old trainers are stopped, the new one is started and its line
    recorded, so the background job of a killed play starts and records nothing.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
  - dflash_deploy_lock_token
options:
  restart:
    description: Restart even when the running trainer matches.
    type: bool
    default: false
  restart_reason:
    description: Why I(restart) is set, for the messages.
    type: str
    default: dflash_restart is set
  force:
    description: Start even when files of current differ from the manifest.
    type: bool
    default: false
  stop_timeout:
    description: Seconds a trainer gets to stop after SIGTERM before SIGKILL.
    type: int
    default: 60
  health_timeout:
    description: Seconds to wait for I(health_steps) training steps.
    type: int
    default: 300
  health_steps:
    description: Training steps the new trainer must finish before its health is judged.
    type: int
    default: 3
  min_tokens_per_s:
    description: Floor on the trainer's tokens/s at the health check; 0 turns it off.
    type: float
    default: 0
  min_throughput_ratio:
    description: Least share of I(baseline_tokens_per_s) the trainer must reach; 0 turns it off.
    type: float
    default: 0
  baseline_tokens_per_s:
    description: The baseline tokens/s (in deploy.yml the median of the newest comparable
      healthy deployments).
    type: float
  baseline_name:
    description: How the failure message names the baseline (its release and time).
    type: str
    default: the baseline
  state:
    description: C(started) launches; C(stopped) only stops every trainer of the root.
    type: str
    choices: [started, stopped]
    default: started
  record:
    description:
      - What the deployment is made of (lock, lock_id, run_sh values, controller); given, the
        healthy trainer's C(history.jsonl) line is written here.
    type: dict
  action:
    description: The action the history line is written as.
    type: str
    choices: [deploy, rollback]
    default: deploy
  previous:
    description: The release current before this run, for the history line.
    type: str
  release:
    description:
      - The release this run makes current. Read in check mode only, where C(current) was not
        switched (default the current release).
    type: str
  tree_sha256:
    description:
      - The code tree of I(release). Read in check mode only; the trainer is kept only when
        it runs this tree (default the current release's).
    type: str
  run_sh_sha256:
    description:
      - The sha256 of the run.sh this run renders. Read in check mode only, where run.sh was
        not rewritten; the trainer is kept only when it was started from it (default the
        run.sh on disk).
    type: str
  job:
    description:
      - This host's part of a training job over several hosts (C(name), C(hosts), C(nnodes),
        C(world_size), C(rdzv_id)); empty for a host on its own.
      - Healthy then also means that the trainer's C(status.json) names this rendezvous id and
        the job's world size (every host's ranks joined).
    type: dict
    default: {}
  stopped_by:
    description: What C(trainer.json) says stopped the trainer (I(state=stopped)).
    type: str
    default: stop.yml
  poll_timeout_s:
    description:
      - Seconds without a task of this run's play reaching the target (each run of the wait
        on this job, M(dflash_wait), notes one in the deploy lock) after which the play is
        taken for dead where its process cannot be seen from the target (a container, another
        host); 0 never. On the local target the process itself is checked.
    type: float
    default: 0
attributes:
  check_mode:
    support: full
    details: Reports whether the trainer would be (re)started and why; starts and stops nothing.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Launch the trainer and prove it healthy
  dflash_launch:
    root: /opt/dflash
  register: launch
"""

RETURN = r"""
pid:
  description: Pid of the trainer (run.sh's process, which execs python or torchrun).
  type: int
  returned: when started
run_id:
  description: Run id; the run's folder is runs/<run_id>.
  type: str
  returned: when started
checksums:
  description: C(files) checked, and C(changed), C(missing), C(extra) paths.
  type: dict
  returned: always
stopped:
  description: C(terminated), C(killed) and C(survivors) pids of the old trainers, and
    C(lost_steps) (steps past the last checkpoint of each killed one).
  type: dict
  returned: always
msg:
  description: What happened, in a sentence (what was stopped, started, adopted or kept).
  type: str
  returned: always
steps_lost:
  description:
    - Steps the previous run had made past the checkpoint the new trainer resumed from (also in
      its history line); 0 when none were lost or it is not known.
  type: int
  returned: when a trainer was started
record_repaired:
  description:
    - What was wrong with trainer.json (missing, torn, naming another pid) when the one trainer
      that runs was found by the process scan and its run folder's own copy; trainer.json is
      rewritten from that copy, and the trainer is judged as any other.
  type: str
  returned: when trainer.json was repaired
adopted:
  description: Whether a running trainer of an interrupted run was health-checked and recorded.
  type: bool
  returned: when started
recorded:
  description: Whether this call wrote the history line.
  type: bool
  returned: when started
status:
  description: The trainer's status.json at the health check.
  type: dict
  returned: when started
tokens_per_s:
  description: Throughput at the health check (also returned when the gate failed it).
  type: float
  returned: when started
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import read_data
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    disk_full_message,
    is_disk_full,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_health import (
    LaunchError,
    job_problem,
    speed_text,
    throughput_problem,
    wait_healthy,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lock_watchdog import Watchdog
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, fence
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_memory import oom_kills
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_plan import KEEP, trainer_plan
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import (
    alive,
    find_trainers,
    jobs,
    stop_all,
    stop_summary,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_record import (
    history_entry,
    record_once,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import file_drift
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_runs import (
    TRAINER_FILE,
    recorded_status,
    start_run,
    trainer_record,
    utc_now,
    write_trainer_record,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    GOOD_RESULTS,
    HISTORY,
    RELEASES,
    RUN_SH,
    STATUS,
    TRAIN_LOG,
    current_release,
    read_history,
    read_manifest,
    read_run_script,
    run_path,
    write_json_atomic,
)


def plan_here(trainers: list[dict], record: dict | None, status: dict, tree: str | None,
              run_sh_sha: str | None, restart: str | None) -> dict:  # fmt: skip
    """module_utils/dflash_plan.py's trainer decision, on what this target holds now (`status`:
    the status.json of the run `record` names)."""
    data = status.get("data") or {}
    return trainer_plan(
        record, trainers, status, read_data(data.get("path")) if data.get("path") else None,
        tree_sha256=tree, run_sh_sha256=run_sh_sha, restart=restart,
    )  # fmt: skip


def stop(module: AnsibleModule, root: str, trainers: list[dict]) -> dict:
    """state=stopped: every trainer of the root, and a note that stop.yml did it."""
    params = module.params
    result: dict = {"changed": bool(trainers), "stopped": {}, "found": [t["pid"] for t in trainers]}
    if not trainers:
        result["msg"] = "no trainer was running"
        return result
    if module.check_mode:
        result["msg"] = f"would stop the trainers {jobs(trainers)}"
        return result
    if params["token"]:
        fence(root, params["token"], phase="stop")
    result["stopped"] = stop_all(trainers, params["stop_timeout"], root)
    record = trainer_record(root, trainers)[0] or {}
    record.update(stopped_at=utc_now(), stopped_by=params["stopped_by"])
    write_json_atomic(os.path.join(root, TRAINER_FILE), record)
    result["msg"] = stop_summary(result["stopped"])
    return result


def judge(params: dict, status: dict, run_id: str, log_path: str) -> float:
    """The job check and the throughput gate on a healthy status; returns its tokens/s."""
    tokens_per_s = float(status.get("tokens_per_s") or 0.0)
    unstarved = status.get("unstarved_tokens_per_s")
    problem = job_problem(status, params["job"]) or throughput_problem(
        params, tokens_per_s, float(unstarved) if unstarved else None
    )
    if problem:
        raise LaunchError(
            f"{problem} after {status.get('step')} steps; see {log_path}",
            run_id=run_id, status=status, tokens_per_s=tokens_per_s,
            # The figure the gate judged, for the failed line (history's one figure).
            unstarved_tokens_per_s=float(unstarved) if unstarved else None,
        )  # fmt: skip
    return tokens_per_s


def record_healthy(root: str, params: dict, dog: Watchdog, manifest: dict, release: str,
                   status: dict, run_id: str, **extra: object) -> bool:  # fmt: skip
    """The healthy trainer's history line, written by the step that proved it."""
    if params["record"] is None:
        return False
    # A play killed during the health wait records nothing: its trainer runs on, unrecorded,
    # and the next deploy or rollback checks and records it (adopt).
    dog.check_now(
        f"record run {run_id} as healthy (its trainer is left running for the next "
        "deploy or rollback to check and record)"
    )
    # The data as the trainer itself read them, in place of what the deploy found at the path.
    data = status.get("data") or params["record"].get("data")
    fields = dict(params["record"], run_id=run_id, tokens_per_s=status.get("tokens_per_s"),
                  unstarved_tokens_per_s=status.get("unstarved_tokens_per_s"),
                  step_spread=status.get("step_spread"), stages=status.get("stages"), data=data,
                  **extra)  # fmt: skip
    entry = history_entry(
        root, manifest, fields, release=release, action=params["action"], result="healthy",
        previous=params["previous"],
    )  # fmt: skip
    if params["token"]:
        fence(root, params["token"], phase="record")
    return record_once(root, entry)


def steps_lost(reached: object, resumed: object) -> int:
    """Steps the previous run made past the checkpoint this one resumed from (0 when unknown,
    or when this one started anew from step 0 for another reason)."""
    if not isinstance(reached, int) or not isinstance(resumed, int) or resumed <= 0:
        return 0
    return max(0, reached - resumed)


def recorded(root: str, run_id: str) -> bool:
    return any(
        e.get("run_id") == run_id and e.get("result") in GOOD_RESULTS for e in read_history(root)
    )


def adopt(module: AnsibleModule, dog: Watchdog, record: dict, manifest: dict, release: str,
          result: dict) -> dict:  # fmt: skip
    """A trainer of the deployed code that history does not know (`record`: its trainer.json):
    a run killed before its record started it, or history lost its line. Its health is checked
    as the launch would have, then it is recorded."""
    params, root = module.params, module.params["root"]
    run_id = record["run_id"]
    result.update(pid=record["pid"], run_id=run_id, changed=True, adopted=True)
    if module.check_mode:
        result["msg"] = f"would check and record the running trainer {record['pid']} (run {run_id})"
        return result
    leader = next((t for t in find_trainers(root) if t["pid"] == record["pid"]), None)
    log_path = run_path(root, run_id, TRAIN_LOG)
    status = wait_healthy(
        # Not this process's child: its exit code cannot be read, only that it is gone.
        lambda: None if leader and alive(leader) else "its process is gone (exit code unknown)",
        run_path(root, run_id, STATUS), log_path, manifest["tree_sha256"],
        params["health_timeout"], params["health_steps"], dog.check,
    )  # fmt: skip
    tokens_per_s = judge(params, status, run_id, log_path)
    result.update(status=status, tokens_per_s=tokens_per_s)
    # Only what is known, read before this run's record writes the file: history may have been
    # lost rather than a run interrupted.
    unrecorded = (
        "history.jsonl is missing"
        if not os.path.isfile(os.path.join(root, HISTORY))
        else "a run killed before its record started it, or history was cut short"
    )
    result["recorded"] = record_healthy(
        root, params, dog, manifest, release, status, run_id,
        adopted_after=record.get("started_at"),
    )  # fmt: skip
    result["msg"] = (
        f"adopted trainer pid {record['pid']} (run {run_id}), unknown to history ({unrecorded}): "
        f"healthy at step {status.get('step')}, {speed_text(status)}, now recorded"
    )
    return result


def wanted(module: AnsibleModule, release: str | None) -> tuple[str | None, str | None, str | None]:
    """The release, tree and run.sh hash the trainer is judged against. In check mode nothing
    was switched or rewritten: what this run makes current, as the caller says it."""
    params, root = module.params, module.params["root"]
    manifest = read_manifest(os.path.join(root, RELEASES, release)) if release else None
    on_disk = ((manifest or {}).get("tree_sha256"), read_run_script(root)["sha256"])
    if not module.check_mode:
        return release, *on_disk
    return (
        params["release"] or release,
        params["tree_sha256"] or on_disk[0],
        params["run_sh_sha256"] or on_disk[1],
    )


def launch(module: AnsibleModule, dog: Watchdog, trainers: list[dict], result: dict) -> dict:
    params, root = module.params, module.params["root"]
    current, _link = current_release(root)
    release, tree, run_sh_sha = wanted(module, current)
    record, record_problem = trainer_record(root, trainers)
    if record_problem:
        result["record_repaired"] = record_problem
        if not module.check_mode:  # the cache is put right; the trainer is judged as it is
            write_json_atomic(os.path.join(root, TRAINER_FILE), record)
    before = recorded_status(root, record)  # the recorded run's status, read once
    restart = params["restart"] and params["restart_reason"]
    plan = plan_here(trainers, record, before, tree, run_sh_sha, restart)
    why = "; ".join(plan["why"])
    if module.check_mode and plan["action"] != KEEP:
        result.update(
            changed=True,
            msg=f"would {plan['action']} the trainer of release {release} ({why})",
            would={"stop": jobs(trainers), "start": release},
        )
        return result
    if current is None:
        raise LaunchError(f"{root}/current is missing or dangling; deploy first")
    folder = os.path.join(root, RELEASES, current)
    manifest = read_manifest(folder) or {}
    drift = file_drift(folder, manifest)
    result["checksums"] = dict(drift, files=len(manifest.get("files", {})), release=current)
    if any(drift.values()) and not params["force"]:
        raise LaunchError(
            f"files of release {current} differ from its manifest (changed {drift['changed']}, "
            f"missing {drift['missing']}, extra {drift['extra']}); deploy.yml puts the release "
            "back from its archive"
        )
    run_sh = os.path.join(root, RUN_SH)
    if run_sh_sha is None:
        raise LaunchError(f"{run_sh} is missing; the runscript step renders it")
    if plan["action"] == KEEP:
        record = record or {}
        status = before
        result.update(
            pid=record["pid"], run_id=record["run_id"], status=status,
            tokens_per_s=status.get("tokens_per_s"),
        )  # fmt: skip
        if params["record"] is not None and not recorded(root, record["run_id"]):
            return adopt(module, dog, record, manifest, current, result)
        result["msg"] = f"already running (pid {record['pid']}), not restarted"
        return result
    result["changed"] = True
    reached = before.get("step")  # the old run's last step
    if params["token"]:
        fence(root, params["token"], phase="launch", release=current)
    dog.check_now("stop the old trainers")
    result["stopped"] = stop_all(trainers, params["stop_timeout"], root)
    leftover = result["stopped"]["survivors"] + [t["pid"] for t in find_trainers(root)]
    if leftover:
        raise LaunchError(
            f"trainer processes {sorted(set(leftover))} survived SIGKILL; not starting"
        )
    # Stopping an old trainer can take a minute (its checkpoint): the play may have died since.
    dog.check_now(f"start the trainer of release {current}")
    proc, run_id, log_path = start_run(root, current, run_sh)
    try:
        write_trainer_record(root, {
            "pid": proc.pid, "run_id": run_id, "release": current, "tree_sha256": tree,
            "run_sh_sha256": run_sh_sha, "started_at": utc_now(),
            # The container's OOM kills so far: verify names the ones after this start.
            "oom_kills": oom_kills(),
        })  # fmt: skip
    except OSError as err:  # untracked, it must not run: stopped, and the failure said as it is
        stop_all([t for t in find_trainers(root) if alive(t)], params["stop_timeout"], root)
        raise LaunchError(
            f"the trainer (run {run_id}) was stopped again: trainer.json could not be written: "
            + (disk_full_message(root, err) if is_disk_full(err) else str(err)),
            run_id=run_id,
        ) from err
    result.update(pid=proc.pid, run_id=run_id)
    if params["token"]:
        fence(root, params["token"], phase="health check", run_id=run_id)
    status_path = run_path(root, run_id, STATUS)
    try:
        status = wait_healthy(
            proc.poll, status_path, log_path, tree, params["health_timeout"],
            params["health_steps"], dog.check,
        )  # fmt: skip
        tokens_per_s = judge(params, status, run_id, log_path)
    except LaunchError as err:
        # An unhealthy trainer must not linger and write into the run folder.
        stop_all([t for t in find_trainers(root) if alive(t)], params["stop_timeout"], root)
        err.details.setdefault("run_id", run_id)
        raise
    result.update(status=status, tokens_per_s=tokens_per_s)
    lost = steps_lost(reached, status.get("resumed_from_step"))
    result["recorded"] = record_healthy(root, params, dog, manifest, current, status, run_id,
                                        **({"steps_lost": lost} if lost else {}))  # fmt: skip
    stopped_text = stop_summary(result["stopped"])
    result["msg"] = (
        f"started trainer pid {proc.pid} (run {run_id}, {why}): healthy at step "
        f"{status.get('step')}, {speed_text(status)}"
        + (f"; old trainers: {stopped_text}" if stopped_text else "")
        + (f"; resumed from the checkpoint of step {status.get('resumed_from_step')}, the "
           f"previous run had reached step {reached}: {lost} steps lost" if lost else "")
    )  # fmt: skip
    result["steps_lost"] = lost
    return result


def run(module: AnsibleModule) -> dict:
    params = module.params
    root = params["root"]
    trainers = find_trainers(root)
    if params["state"] == "stopped":
        return stop(module, root, trainers)
    result: dict = {"changed": False, "stopped": {}, "found": [t["pid"] for t in trainers],
                    "adopted": False, "recorded": False}  # fmt: skip
    token = None if module.check_mode else params["token"]
    with Watchdog(root, token, poll_timeout_s=params["poll_timeout_s"]) as dog:
        result = launch(module, dog, trainers, result)
    if result.get("record_repaired"):
        done = "would be rewritten" if module.check_mode else "rewritten"
        result["msg"] = f"{result['record_repaired']} ({done}); {result.get('msg', '')}"
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            restart={"type": "bool", "default": False},
            restart_reason={"type": "str", "default": "dflash_restart is set"},
            force={"type": "bool", "default": False},
            stop_timeout={"type": "int", "default": 60},
            health_timeout={"type": "int", "default": 300},
            health_steps={"type": "int", "default": 3},
            min_tokens_per_s={"type": "float", "default": 0.0},
            min_throughput_ratio={"type": "float", "default": 0.0},
            baseline_tokens_per_s={"type": "float"},
            baseline_name={"type": "str", "default": "the baseline"},
            state={"type": "str", "choices": ["started", "stopped"], "default": "started"},
            record={"type": "dict"},
            action={"type": "str", "choices": ["deploy", "rollback"], "default": "deploy"},
            previous={"type": "str"},
            release={"type": "str"},
            tree_sha256={"type": "str"},
            run_sh_sha256={"type": "str"},
            job={"type": "dict", "default": {}},
            stopped_by={"type": "str", "default": "stop.yml"},
            poll_timeout_s={"type": "float", "default": 0.0},
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except LaunchError as err:
        module.fail_json(msg=str(err), **err.details)
    except LockError as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        if not is_disk_full(err):
            raise
        module.fail_json(msg=disk_full_message(module.params["root"], err))


if __name__ == "__main__":
    main()
