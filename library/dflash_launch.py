#!/usr/bin/python
# The last step of a deploy: prove the files, stop every old trainer, start one, prove health.
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
    C(runs/latest) at it, and waits up to I(health_timeout) for C(status.json) to say
    C(running) with step >= I(health_steps) and the code tree hash of C(current); else fails
    with the log tail.
  - Throughput gate: then fails when the trainer's tokens/s is under I(min_tokens_per_s), or
    under I(min_throughput_ratio) times I(baseline_tokens_per_s) (the previous healthy
    deployment's); the failure stops the new trainer and names both numbers.
  - Idempotent: when the one running trainer already runs the current tree with the current
    run.sh (which names the env and the cache), nothing is restarted unless I(restart).
options:
  root:
    description: State root on the target.
    type: path
    required: true
  restart:
    description: Restart even when the running trainer matches.
    type: bool
    default: false
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
    description: tokens/s that the previous healthy deployment measured at its health check.
    type: float
  baseline_name:
    description: How the failure message names the baseline (its release and time).
    type: str
    default: the previous healthy deployment
  state:
    description: C(started) launches; C(stopped) only stops every trainer of the root.
    type: str
    choices: [started, stopped]
    default: started
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
  description: C(terminated), C(killed) and C(survivors) pids of the old trainers.
  type: dict
  returned: always
status:
  description: The trainer's status.json at the health check.
  type: dict
  returned: when started
tokens_per_s:
  description: Throughput at the health check (also returned when the gate failed it).
  type: float
  returned: when started
"""

import contextlib
import json
import os
import subprocess
import time
from datetime import UTC, datetime

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dflash_procs import ROOT_MARKER, alive, find_trainers, jobs, stop_all
from ansible.module_utils.dflash_release import file_drift
from ansible.module_utils.dflash_state import (
    RELEASES,
    TMP_PREFIX,
    current_release,
    read_json,
    read_manifest,
    read_run_script,
)

TRAINER_FILE = "trainer.json"
RUNS = "runs"
LOG_TAIL_LINES = 40


class LaunchError(Exception):
    """A failed launch; `details` (run id, status, tokens/s) go back with the message."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


def log_tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-LOG_TAIL_LINES:])
    except OSError:
        return "(no log)"


def running_matches(
    root: str, trainers: list[dict], tree: str, run_sh_sha: str | None
) -> dict | None:
    """The status of the one running trainer when it already runs what is deployed (one job:
    torchrun's workers belong to the process run.sh became)."""
    record = read_json(os.path.join(root, TRAINER_FILE))
    if not record or jobs(trainers) != [record.get("pid")]:
        return None
    status = read_json(os.path.join(root, RUNS, record["run_id"], "status.json")) or {}
    if (
        record.get("run_sh_sha256") == run_sh_sha
        and status.get("code_tree_sha256") == tree
        and status.get("state") in ("running", "checkpointing", "warming")
    ):
        return {"record": record, "status": status}
    return None


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.{TMP_PREFIX}{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


def new_run_id(release: str) -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{release}"


def point_latest(root: str, run_id: str) -> None:
    tmp = os.path.join(root, RUNS, f"{TMP_PREFIX}latest-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(run_id, tmp)
    os.replace(tmp, os.path.join(root, RUNS, "latest"))


def start(root: str, release: str, run_sh: str) -> tuple[subprocess.Popen, str, str]:
    run_id = new_run_id(release)
    run_dir = os.path.join(root, RUNS, run_id)
    os.makedirs(run_dir)
    log_path = os.path.join(run_dir, "train.log")
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "DFLASH_RUN_ID": run_id,
        ROOT_MARKER: os.path.realpath(root),
    }
    with open(log_path, "xb") as log:
        proc = subprocess.Popen(
            ["/bin/bash", run_sh], cwd=root, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )  # fmt: skip
    point_latest(root, run_id)
    return proc, run_id, log_path


def wait_healthy(proc: subprocess.Popen, status_path: str, log_path: str, tree: str,
                 timeout: int, steps: int) -> dict:  # fmt: skip
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = read_json(status_path) or status
        if status.get("state") == "failed" or proc.poll() is not None:
            raise LaunchError(
                f"the trainer exited at start (exit {proc.poll()}, state {status.get('state')}); "
                f"last lines of {log_path}:\n{log_tail(log_path)}"
            )
        # Steps of this run: a trainer that resumed a checkpoint starts from its step.
        done = (status.get("step") or 0) - (status.get("resumed_from_step") or 0)
        if status.get("state") == "running" and done >= steps:
            if status.get("code_tree_sha256") != tree:
                raise LaunchError(
                    f"the trainer runs code tree {status.get('code_tree_sha256')}, but current "
                    f"is {tree}: it did not import the deployed release; see {log_path}"
                )
            return status
        time.sleep(0.2)
    raise LaunchError(
        f"fewer than {steps} training steps within {timeout} s (state "
        f"{status.get('state') or 'none'}, step {status.get('step')}); raise health_timeout or "
        "read the log. Last lines of "
        f"{log_path}:\n{log_tail(log_path)}"
    )


def throughput_problem(params: dict, tokens_per_s: float) -> str | None:
    """Why a healthy-looking trainer is still too slow to keep, or None."""
    floor = params["min_tokens_per_s"]
    if floor and tokens_per_s < floor:
        return (
            f"throughput gate: {tokens_per_s:.1f} tokens/s is under the floor of {floor:g} "
            "(dflash_min_tokens_per_s)"
        )
    ratio, baseline = params["min_throughput_ratio"], params["baseline_tokens_per_s"]
    if ratio and baseline and tokens_per_s < ratio * baseline:
        return (
            f"throughput gate: {tokens_per_s:.1f} tokens/s is under {ratio:g} x {baseline:.1f} "
            f"tokens/s of {params['baseline_name']} = {ratio * baseline:.1f} "
            "(dflash_min_throughput_ratio)"
        )
    return None


def run(module: AnsibleModule) -> dict:
    params = module.params
    root = params["root"]
    trainers = find_trainers(root)
    result: dict = {"changed": False, "stopped": {}, "found": [t["pid"] for t in trainers]}
    if params["state"] == "stopped":
        if trainers and not module.check_mode:
            result["stopped"] = stop_all(trainers, params["stop_timeout"])
        result["changed"] = bool(trainers)
        return result

    release, _link = current_release(root)
    if release is None:
        raise LaunchError(f"{root}/current is missing or dangling; deploy first")
    folder = os.path.join(root, RELEASES, release)
    manifest = read_manifest(folder) or {}
    drift = file_drift(folder, manifest)
    result["checksums"] = dict(drift, files=len(manifest.get("files", {})), release=release)
    if any(drift.values()) and not params["force"]:
        raise LaunchError(
            f"files of release {release} differ from its manifest (changed {drift['changed']}, "
            f"missing {drift['missing']}, extra {drift['extra']}); redeploy, or force: true"
        )
    run_sh = os.path.join(root, "run.sh")
    run_sh_sha = read_run_script(root)["sha256"]
    if run_sh_sha is None:
        raise LaunchError(f"{run_sh} is missing; the runscript step renders it")
    tree = manifest["tree_sha256"]
    match = None if params["restart"] else running_matches(root, trainers, tree, run_sh_sha)
    if match:
        result.update(
            pid=match["record"]["pid"],
            run_id=match["record"]["run_id"],
            status=match["status"],
            tokens_per_s=match["status"].get("tokens_per_s"),
        )
        return result
    result["changed"] = True
    if module.check_mode:
        result["would"] = {"stop": result["found"], "start": release}
        return result
    result["stopped"] = stop_all(trainers, params["stop_timeout"])
    leftover = result["stopped"]["survivors"] + [t["pid"] for t in find_trainers(root)]
    if leftover:
        raise LaunchError(
            f"trainer processes {sorted(set(leftover))} survived SIGKILL; not starting"
        )
    proc, run_id, log_path = start(root, release, run_sh)
    record = {
        "pid": proc.pid,
        "run_id": run_id,
        "release": release,
        "tree_sha256": tree,
        "run_sh_sha256": run_sh_sha,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_json_atomic(os.path.join(root, TRAINER_FILE), record)
    result.update(pid=proc.pid, run_id=run_id)
    status_path = os.path.join(root, RUNS, run_id, "status.json")
    try:
        status = wait_healthy(
            proc, status_path, log_path, tree, params["health_timeout"], params["health_steps"]
        )
        tokens_per_s = float(status.get("tokens_per_s") or 0.0)
        problem = throughput_problem(params, tokens_per_s)
        if problem:
            raise LaunchError(
                f"{problem} after {status.get('step')} steps; see {log_path}",
                run_id=run_id, status=status, tokens_per_s=tokens_per_s,
            )  # fmt: skip
    except LaunchError as err:
        # An unhealthy trainer must not linger and write into the run folder.
        stop_all([t for t in find_trainers(root) if alive(t)], params["stop_timeout"])
        err.details.setdefault("run_id", run_id)
        raise
    result.update(status=status, tokens_per_s=tokens_per_s)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "restart": {"type": "bool", "default": False},
            "force": {"type": "bool", "default": False},
            "stop_timeout": {"type": "int", "default": 60},
            "health_timeout": {"type": "int", "default": 300},
            "health_steps": {"type": "int", "default": 3},
            "min_tokens_per_s": {"type": "float", "default": 0.0},
            "min_throughput_ratio": {"type": "float", "default": 0.0},
            "baseline_tokens_per_s": {"type": "float"},
            "baseline_name": {"type": "str", "default": "the previous healthy deployment"},
            "state": {"type": "str", "choices": ["started", "stopped"], "default": "started"},
        },
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except LaunchError as err:
        module.fail_json(msg=str(err), **err.details)


if __name__ == "__main__":
    main()
