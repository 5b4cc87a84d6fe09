#!/usr/bin/python
# The live state of one target as one JSON document, in one call; never changes anything.
# Over 300 lines because ~190 are the DOCUMENTATION and RETURN of that document; the code (~220)
# only gathers what the module_utils read.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_facts
short_description: Read the whole dflash state of a target in one call
description:
  - Read-only. Returns the state root, the C(current) release and its manifest, the files of
    C(current) checked against that manifest (changed, missing, extra), the unpacked releases,
    the deployment history and the default rollback target.
  - Also the trainers of the root with their status files, the figures their tokens/s is
    judged against (from the whole history), and what C(nvidia-smi) shows of the GPUs and
    their compute processes, matched to the trainers by pid namespace.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
options:
  checksums:
    description: Hash every file of C(current) against its manifest.
    type: bool
    default: true
  history_limit:
    description: How many of the newest history entries to return.
    type: int
    default: 50
  baseline_from:
    description:
      - The first deployment, by its history.yml number, that C(throughput_references) may
        name as the fastest (C(dflash_throughput_baseline_from)); 1 takes the whole history.
    type: int
    default: 1
  check_release:
    description: A release id whose files on the target are checked against its manifest.
    type: str
  lock:
    description: An environment lock whose Python and wheelhouse are checked on the target.
    type: dict
  data:
    description:
      - The training data a deploy names (C(dflash_data)), read as C(wanted_data) without
        reading the data itself (a store's manifest and its arrays' sizes, a file's size).
    type: str
  max_cpu_wait:
    description:
      - The share of its time a trainer may wait for a CPU (C(dflash_verify_max_cpu_wait)).
        When a trainer that has run C(contention_after) seconds waited more in each of its
        last windows, returns C(cpu_consumers), a 1 s sample of the processes that took the
        CPU, its own left out. 1 never samples.
    type: float
    default: 1.0
  contention_after:
    description: Seconds a trainer runs before its wait for a CPU is judged.
    type: float
    default: 300
  rollback_release:
    description:
      - The release a rollback goes to (an empty string for the previous deployment); returns
        C(rollback_entry), that release's last good deployment, and C(rollback_env), the env
        it recorded, so that a rollback whose env is complete asks the target nothing more
        about it.
    type: str
attributes:
  check_mode:
    support: full
    details: Reads only, so a check-mode run reads the same.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Read the target's state
  dflash_facts:
    root: /opt/dflash
  register: state
"""

RETURN = r"""
root_exists:
  description: Whether the state root exists.
  type: bool
  returned: always
root_parent_exists:
  description: Whether the folder that holds the state root exists.
  type: bool
  returned: always
current:
  description: C(release), C(link) (the raw link text), C(dangling), C(manifest) (no file list).
  type: dict
  returned: always
files:
  description: C(changed), C(missing) and C(extra) paths of C(current) against its manifest.
  type: dict
  returned: when checksums and current exists
releases:
  description: Complete releases on the target.
  type: list
  elements: str
  returned: always
disk:
  description: The file system of the root (or of its nearest existing parent) C(path),
    C(free_bytes) and C(total_bytes).
  type: dict
  returned: always
memory:
  description: The memory cgroup the target runs in (a container's own), C(oom_kills) (the
    processes the kernel OOM-killed in it; null where unreadable) and C(limit_mb) (null for
    none).
  type: dict
  returned: always
cpu_consumers:
  description:
    - Only when a trainer waited for a CPU over C(max_cpu_wait) of its time, the processes
      that took the CPU over a 1 s sample (C(top), each C(pid), C(name), C(cpu) in CPUs and
      C(cmdline)), C(others_cpu) their sum, C(cpus) this target's CPUs. The trainers, what
      runs under them and this module's own parents are left out. Null otherwise.
  type: dict
  returned: always
recorded_trees:
  description:
    - Per release name, the C(tree_sha256), C(commit) and C(time) of its newest deploy or
      rollback in history.jsonl (a build of that name with another tree is refused).
  type: dict
  returned: always
release_trees:
  description: Tree hash of each complete release, by release id.
  type: dict
  returned: always
history:
  description: The newest history.jsonl entries, oldest first.
  type: list
  elements: dict
  returned: always
previous_deployment:
  description: The default rollback target (the release deployed before current).
  type: str
  returned: always
gpus:
  description: GPUs visible in the target (index, name, uuid, driver); null without nvidia-smi.
  type: list
  elements: dict
  returned: always
gpu:
  description:
    - What nvidia-smi shows, for verify's C(gpu) finding; C(smi) is null without nvidia-smi.
    - C(gpus) (index, uuid, name, bus id, memory used and total in MiB, C(lost)), C(problems)
      (GPUs it could not reach, its own errors), C(apps) (compute processes - pid, name, MiB,
      GPU uuid), C(job) (pid and NStgid of each trainer process), C(local) (pid, NStgid and
      command line of each listed pid visible here) and C(in_init_pid_namespace).
  type: dict
  returned: always
throughput_references:
  description:
    - C(health_check) (the deployment of current, as measured at its health check) and
      C(fastest) (the fastest healthy deployment of the same layout, shape and data), each with
      C(number), C(release), C(time), C(tokens_per_s), C(stages); null where there is none.
  type: dict
  returned: always
run_sh:
  description: C(path), C(content) and C(sha256) of run.sh (content null when missing).
  type: dict
  returned: always
run_sh_changes:
  description:
    - The lines removed (C(-)) and added (C(+)) in run.sh against the text the deployment of
      current recorded (at most 12, then how many more); empty when they agree.
  type: list
  elements: str
  returned: always
history_damaged:
  description: The lines of history.jsonl that are not a JSON record (line from 1, bytes, text).
  type: list
  elements: dict
  returned: always
history_exists:
  description: Whether history.jsonl is there (a root with releases and no history lost it).
  type: bool
  returned: always
unknown_releases:
  description:
    - Releases on the target that no line of history names (history lost or cut short, or a
      run killed before its record); keep-N never deletes them.
  type: list
  elements: str
  returned: always
deployment:
  description: The history entry that deployed current (what should be there), without run.sh text.
  type: dict
  returned: always
trainers:
  description:
    - C(record) (trainer.json, or when that is lost the copy in the run folder of the one
      trainer that runs; C(record_problem) then says what was wrong) and C(processes), every
      trainer process of the root with pid,
      pgid, job (the pid of its topmost trainer ancestor, torchrun's for its workers), start
      time and age in seconds, command line, run id, release it runs from, cache dir, its
      run's status.json and the heartbeat age in seconds; C(supervisor), the recorded run's
      supervisor.json; C(down_status), the recorded run's last status.json while its trainer
      is down (its supervisor in back-off or crash loop, or no process of the run; else null).
  type: dict
  returned: always
environment:
  description:
    - The env of that deployment, C(exists), C(drift) (packages against its lock), C(python)
      and C(adopted) (the interpreter of a lock that adopts one).
  type: dict
  returned: always
cache:
  description: The compile cache of that deployment, C(exists) and C(built_by).
  type: dict
  returned: always
data:
  description:
    - By path, what lies now where a running trainer's status.json says its data are
      (C(kind) store, jsonl, missing or unreadable; a store's manifest summary and
      C(problems)), for verify's C(data) finding.
  type: dict
  returned: always
wanted_data:
  description: What lies at I(data) (as C(data) describes it; C(kind) self_generated too).
  type: dict
  returned: when data is given
checkpoints:
  description: C(count) and C(newest) checkpoint.
  type: dict
  returned: always
deploy_lock:
  description: The deploy lock of a run in progress or interrupted (null when none), with
    C(age_s) and C(holder_alive) (null where the target cannot tell).
  type: dict
  returned: always
deploy_lock_generation:
  description:
    - How many times the deploy lock was taken, read before everything else; the facts were read
      while no run took it (read again when one did). A deploy hands it to
      M(dflash_deploy_lock) (I(expect_generation)), which says whether this read still holds.
      Null when the lock was held (a run changes, or was interrupted while it changed, what was
      read) or runs kept taking it during three reads, so that no read is to be trusted.
  type: int
  returned: always
root_writable:
  description: C(ok), C(folder) probed and C(error), from creating a file there.
  type: dict
  returned: always
release_check:
  description: C(present) and C(drift) (changed, missing, extra) of I(check_release).
  type: dict
  returned: when check_release is given
lock_problems:
  description: Why I(lock) cannot be built on this target (its Python, missing wheels).
  type: list
  elements: str
  returned: when lock is given
wanted_env:
  description:
    - The env of I(lock) (C(envs/<lock-id>)) as C(environment) describes one, with C(python),
      the interpreter run.sh would start; a deploy whose env exists without drift builds none.
    - An env still to be built also has C(estimate_bytes) and C(estimate_basis), how large it
      will be, about (preflight checks the free space against it).
  type: dict
  returned: when lock is given and is a valid lock
rollback_entry:
  description:
    - The history entry rollback.yml restores, the newest healthy or deployed one of
      I(rollback_release) (its lock and run.sh); empty when history has none.
  type: dict
  returned: when rollback_release is given
rollback_number:
  description:
    - The number of C(rollback_entry) in history (1 the oldest, as history.yml numbers them);
      null when history has none.
  type: int
  returned: when rollback_release is given
rollback_env:
  description:
    - The env (as C(environment) describes one) of C(rollback_entry); null when that entry
      recorded no env.
  type: dict
  returned: when rollback_release is given and history has such an entry
rollback_data:
  description:
    - What lies now where the data of C(rollback_entry) lay (as C(wanted_data) describes it); a
      rollback's preflight refuses data that are gone or no longer a whole store, as a deploy's
      refuses its I(data).
  type: dict
  returned: when rollback_release is given and that entry trained on a store or a JSONL file
"""

import os
import time
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_checks import (
    environment_check,
    release_check,
    writable,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    read as read_cache,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_contention import judge
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_cpu_top import cpu_consumers
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import (
    read_data,
    running_data,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import free_space
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    adopts,
    installed_versions,
    interpreter_versions,
    lock_problems,
    version_drift,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    lock_id as lock_id_of,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_envcheck import install_estimate
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_gpu import probe
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import (
    GOOD_RESULTS,
    records_code,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    generation,
    read_lock,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_memory import memory_facts
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import find_trainers
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import (
    file_drift,
    tree_sha256,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_runs import trainer_record
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    CURRENT,
    ENV_MARKER,
    ENVS,
    HISTORY,
    RELEASES,
    STATUS,
    SUPERVISOR,
    changed_lines,
    current_release,
    deployment_index,
    previous_deployment,
    read_history_checked,
    read_json,
    read_run_script,
    release_manifests,
    run_path,
    stale_temp_dirs,
    unknown_releases,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import supervisor_is
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    throughput_references,
)


def age_seconds(stamp: str | None) -> float | None:
    try:
        then = datetime.fromisoformat(str(stamp))
    except ValueError:
        return None
    return round(time.time() - then.timestamp(), 1)


def boot_time() -> float:
    with open("/proc/stat", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("btime"):
                return float(line.split()[1])
    return 0.0


def trainers(root: str) -> dict:
    """Every trainer process of the root with the status file of its run, and the record of the
    one the toolkit started (trainer.json, or its run folder's copy when that one is lost:
    record_problem says what was wrong)."""
    ticks, booted = os.sysconf("SC_CLK_TCK"), boot_time()
    processes = []
    for proc in find_trainers(root):
        status = read_json(run_path(root, proc["run_id"], STATUS)) if proc[
            "run_id"] else None  # fmt: skip
        cwd = proc["cwd"]
        releases = os.path.join(os.path.realpath(root), RELEASES) + os.sep
        processes.append({
            "pid": proc["pid"], "pgid": proc["pgid"], "job": proc["job"],
            "state": proc["state"], "cmdline": proc["cmdline"],
            "run_id": proc["run_id"], "cache_dir": proc["cache_dir"], "cwd": cwd,
            "release": cwd[len(releases):].split(os.sep)[0] if cwd.startswith(releases) else None,
            "started_at": datetime.fromtimestamp(booted + proc["start_ticks"] / ticks,
                                                 tz=timezone.utc).isoformat(timespec="seconds"),
            "age_s": round(time.time() - booted - proc["start_ticks"] / ticks, 1),
            "status": status,
            "heartbeat_age_s": age_seconds((status or {}).get("updated_at")),
        })  # fmt: skip
    record, problem = trainer_record(root, processes)
    # The supervisor of the recorded run (dflash/supervision/supervisor.py): its restarts and
    # goodput.
    run_id = (record or {}).get("run_id")
    supervisor = read_json(run_path(root, run_id, SUPERVISOR)) if run_id else None
    # The recorded run's last status while its trainer is down (its supervisor waits out a
    # back-off or gave up; or no process of the run lives): the data it read are still judged
    # against what lies at their path.
    down = (
        read_json(run_path(root, run_id, STATUS))
        if run_id and (supervisor_is(supervisor, "down") or supervisor_is(supervisor, "gave_up")
                       or not any(p["run_id"] == run_id for p in processes))
        else None
    )  # fmt: skip
    return {"record": record, "record_problem": problem, "processes": processes,
            "supervisor": supervisor, "down_status": down}  # fmt: skip


def environment(root: str, lock_id: str | None, lock: dict | None = None) -> dict | None:
    """The env a deployment recorded (or the env of `lock`, which a deploy wants): what is
    installed there against its lock (no import), and the interpreter run.sh starts."""
    if not lock_id:
        return None
    env_dir = os.path.join(root, ENVS, lock_id)
    marker = read_json(os.path.join(env_dir, ENV_MARKER))
    lock = lock or (marker or {}).get("lock")
    # An adopted interpreter (source.python) is read where it is, not under envs/.
    python = adopts(lock) if lock else None
    installed = (interpreter_versions(python) or {}) if python else installed_versions(env_dir)
    return {
        "lock_id": lock_id,
        "path": env_dir,
        "adopted": python,
        "python": str(python) if python else os.path.join(env_dir, "bin", "python"),
        "exists": marker is not None,
        "drift": version_drift(lock, installed) if lock else [],
    }


def checkpoints(root: str) -> dict:
    folder = os.path.join(root, "checkpoints")
    names = sorted(n for n in os.listdir(folder) if not n.startswith(".")) if os.path.isdir(
        folder) else []  # fmt: skip
    return {"path": folder, "count": len(names), "newest": names[-1] if names else None}


def recorded_trees(history: list[dict]) -> dict[str, dict]:
    """Per release name, the tree (and commit) its newest deploy or rollback line recorded."""
    trees: dict[str, dict] = {}
    for entry in history:
        if records_code(entry) and entry.get("tree_sha256"):
            trees[entry["release"]] = {
                "tree_sha256": entry["tree_sha256"],
                "commit": entry.get("commit"),
                "time": entry.get("time"),
            }
    return trees


def gather(root: str, checksums: bool, history_limit: int, baseline_from: int = 1) -> dict:
    """The state of the root; the preflight questions are added by main()."""
    release, link = current_release(root)
    manifests = release_manifests(root)
    available = list(manifests)
    history, damaged = read_history_checked(root)
    facts: dict = {
        "root": root,
        "root_exists": os.path.isdir(root),
        "root_parent_exists": os.path.isdir(os.path.dirname(os.path.normpath(root))),
        "current": {
            "release": release,
            "link": link,
            "dangling": link is not None and release is None,
            # A folder or file copied over the link by hand.
            "not_a_link": os.path.lexists(os.path.join(root, CURRENT))
            and not os.path.islink(os.path.join(root, CURRENT)),
            "manifest": None,
        },
        "releases": available,
        "release_trees": {name: m.get("tree_sha256") for name, m in manifests.items()},
        # What each release name meant when it was deployed (a name always means one tree).
        "recorded_trees": recorded_trees(history),
        "history": history[-history_limit:] if history_limit > 0 else [],
        # Lines of history.jsonl that are not a record (line from 1, bytes, text).
        "history_damaged": damaged,
        "history_exists": os.path.isfile(os.path.join(root, HISTORY)),
        # Releases on the target that no line of history names (keep-N keeps them).
        "unknown_releases": unknown_releases(history, available),
        "previous_deployment": previous_deployment(history, release, available),
        "stale_temp": stale_temp_dirs(root),
        "run_sh": read_run_script(root),
        "deploy_lock": read_lock(root),
        "root_writable": writable(root),
        "disk": free_space(root),
        "memory": memory_facts(),
    }
    if release:
        folder = os.path.join(root, RELEASES, release)
        manifest = manifests.get(release, {})
        facts["current"]["manifest"] = {k: v for k, v in manifest.items() if k != "files"}
        # A hand-edited MANIFEST.json would hide edited files: its own hash must still add up.
        facts["current"]["manifest_consistent"] = tree_sha256(
            manifest.get("files", {})
        ) == manifest.get("tree_sha256")
        facts["current"]["path"] = os.path.join(root, CURRENT)
        if checksums:
            facts["files"] = file_drift(folder, manifest)
    index = deployment_index(history, release)
    deployment = None if index is None else history[index]
    facts["deployment"] = (
        {k: v for k, v in deployment.items() if k != "run_sh_text"} if deployment else None
    )
    # What a hand edit changed in run.sh, line by line (verify's run_script finding shows it).
    facts["run_sh_changes"] = changed_lines(
        (deployment or {}).get("run_sh_text"), facts["run_sh"]["content"]
    )
    # The figures a running trainer's tokens/s is judged against, over the whole history.
    facts["throughput_references"] = throughput_references(history, index, baseline_from)
    facts["trainers"] = trainers(root)
    facts["data"] = {
        path: read_data(path)
        for path in running_data(
            facts["trainers"]["processes"] + [{"status": facts["trainers"]["down_status"]}]
        )
    }
    facts["gpu"] = probe([proc["pid"] for proc in facts["trainers"]["processes"]])
    facts["gpus"] = (
        None
        if facts["gpu"]["smi"] is None
        else [{key: gpu[key] for key in ("index", "name", "uuid", "driver")}
              for gpu in facts["gpu"]["gpus"]]
    )  # fmt: skip
    facts["environment"] = environment(root, (deployment or {}).get("lock_id"))
    facts["cache"] = read_cache(root, ((deployment or {}).get("run_sh") or {}).get("cache_dir"))
    facts["checkpoints"] = checkpoints(root)
    return facts


def consumers_if_contended(processes: list[dict], max_wait: float, after_s: float) -> dict | None:
    """Who took the CPU over a short sample, only when a trainer waited for one too long:
    the sample costs a second."""
    if not any(
        judge(p["status"], p["age_s"], max_wait, after_s)["contended"]
        for p in processes if p.get("status")
    ):  # fmt: skip
        return None
    return cpu_consumers({p["pid"] for p in processes})


def read(params: dict) -> dict:
    """The facts of the root and the answers to this call's questions (the lock's env, the
    release and data to check, what a rollback restores)."""
    facts = gather(params["root"], params["checksums"], params["history_limit"],
                   params["baseline_from"])  # fmt: skip
    if params["check_release"]:
        facts["release_check"] = release_check(params["root"], params["check_release"])
    if params["lock"] is not None:
        if not lock_problems(params["lock"], unhashed_ok=True):
            wanted = lock_id_of(params["lock"])
            deployed = facts["environment"]
            # A redeploy of the same lock: that env was just read (the same pins, so the same
            # drift); reading its packages again would double the slowest part of this call.
            facts["wanted_env"] = (
                deployed
                if deployed and deployed["exists"] and deployed["lock_id"] == wanted
                else environment(params["root"], wanted, params["lock"])
            )
            env = facts["wanted_env"]
            # Hashing the wheels (a CUDA closure is gigabytes) only where they are installed:
            # an env already built from this lock was checked when it was.
            facts["lock_problems"] = environment_check(params["lock"], not env["exists"])
            if not env["exists"] and not env["adopted"]:  # to be built: how large, about
                reference = deployed["path"] if deployed and deployed["exists"] else None
                env["estimate_bytes"], env["estimate_basis"] = install_estimate(
                    params["lock"], reference
                )
        else:
            facts["lock_problems"] = environment_check(params["lock"])
    if params["data"] is not None:
        facts["wanted_data"] = read_data(params["data"])
    facts["cpu_consumers"] = consumers_if_contended(
        facts["trainers"]["processes"], params["max_cpu_wait"], params["contention_after"]
    )
    if params["rollback_release"] is not None:
        release = params["rollback_release"] or facts["previous_deployment"]
        # The entry rollback.yml restores: the newest good deployment of that release.
        numbers = [
            number for number, e in enumerate(facts["history"], start=1)
            if e.get("release") == release and e.get("result") in GOOD_RESULTS
        ]  # fmt: skip
        entry = facts["history"][numbers[-1] - 1] if numbers else {}
        facts["rollback_entry"] = entry
        facts["rollback_number"] = numbers[-1] if numbers else None
        if entry:
            facts["rollback_env"] = environment(params["root"], entry.get("lock_id"))
            data = entry.get("data") or {}
            if data.get("kind") in ("store", "jsonl") and data.get("path"):
                facts["rollback_data"] = read_data(data["path"])
    return facts


def read_between_takes(params: dict) -> dict:
    """read(), with the lock's generation of the moment it was read, when the lock was free:
    read again when a run took the lock meanwhile (a deploy then changes what was being read)."""
    for _ in range(3):
        before = generation(params["root"])
        facts = read(params)
        if generation(params["root"]) == before:
            free = facts["deploy_lock"] is None
            return {**facts, "deploy_lock_generation": before if free else None}
    return {**facts, "deploy_lock_generation": None}


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=False,
            checksums={"type": "bool", "default": True},
            history_limit={"type": "int", "default": 50},
            baseline_from={"type": "int", "default": 1},
            check_release={"type": "str"},
            lock={"type": "dict"},
            rollback_release={"type": "str"},
            data={"type": "str"},
            max_cpu_wait={"type": "float", "default": 1.0},
            contention_after={"type": "float", "default": 300},
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **read_between_takes(module.params))


if __name__ == "__main__":
    main()
