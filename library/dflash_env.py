#!/usr/bin/python
# Builds envs/<lock-id> holding exactly the locked wheels, and proves it. Over 300 lines with its
# ~80 lines of DOCUMENTATION; the code (~250) is one build: venv, install, proof, marker, swap.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_env
short_description: A venv with exactly the locked wheels, checked against the lock
description:
  - Creates C(envs/<lock-id>) from the lock (python, torch, triton, the other wheels of the
    closure, the source) with C(uv pip install --no-deps) (uv from its wheel in the wheelhouse,
    or on the target's PATH) or else C(pip install --no-deps) of exactly the pinned versions,
    each file checked against the lock's hashes where it has them, then
    checks the installed versions (local suffix included), C(torch.__version__),
    C(torch.version.cuda) and, where C(nvidia-smi) exists, the driver against the CUDA build.
  - Every check of the lock and its source runs before anything is created. A new lock is a new
    env; an env is never re-installed for another lock. An env of this lock whose packages were
    changed by hand is rebuilt, and the drift is returned.
  - The env is marked complete only at the end, so a killed build is rebuilt next time. A build
    that fails (pip, or the disk) removes what it had installed.
  - The build stops, and removes its env, when the free space of the root's file system falls
    under I(disk_reserve_mb), so that the running trainer keeps room to write its checkpoints.
  - A lock whose source is an existing interpreter (C(source.python)) adopts it. Nothing is
    installed into it; it must hold every pin (and torch its CUDA build), else the module fails
    naming each difference. C(envs/<lock-id>/) then only records the adoption.
  - In check mode nothing is created; the result says whether the env would be built and, with
    C(--diff), shows the pins of the env the current deployment uses (or the drifted env as
    installed) against the pins of the lock.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
options:
  lock:
    description: The lock (see docs/environment-lock.md).
    type: dict
    required: true
  pip_timeout:
    description: Seconds the install may take.
    type: int
    default: 1800
  disk_reserve_mb:
    description: Free space (MB) the build never takes from the root's file system (0 = off).
    type: int
    default: 1024
  token:
    description:
      - The deploy lock's token of this run (M(dflash_deploy_lock)). A build ends, and its pip
        with it, when this run loses the lock or its ansible-playbook process dies.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Pin the training environment
  dflash_env:
    root: /opt/dflash
    lock: "{{ dflash_env_lock }}"
  register: env
"""

RETURN = r"""
lock_id:
  description: Id of the lock, the env's folder name.
  type: str
  returned: always
env_dir:
  description: Path of the env.
  type: str
  returned: always
python:
  description: The env's interpreter.
  type: str
  returned: always
drift:
  description: Packages of an existing env that differed from the lock (then rebuilt).
  type: list
  elements: dict
  returned: always
versions:
  description: torch, cuda (torch.version.cuda) and the driver found.
  type: dict
  returned: when built
msg:
  description: What was (or in check mode would be) done, naming the env and the pins that change.
  type: str
  returned: always
diff:
  description:
    - C(before) the pins of the env the current deployment uses (or, for an env of this lock
      changed by hand, its installed versions), C(after) the pins of the lock, one per line.
  type: dict
  returned: when changed
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    MB,
    DiskGuard,
    DiskSpaceError,
    disk_full_message,
    is_disk_full,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    adopts,
    installed_versions,
    lock_id,
    lock_problems,
    pin_changes,
    pinned,
    requirement_lines,
    version_drift,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_envcheck import (
    EnvError,
    check_adopted,
    check_runtime,
    check_wheelhouse,
    find_python,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_guarded import (
    CommandError,
    run_checked,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_installer import install_command
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lock_watchdog import Watchdog
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, fence
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    ENV_MARKER,
    ENVS,
    current_release,
    deployment_index,
    read_history,
)


def requirements_file(lock: dict) -> str:
    """The pins as pip reads them; with every wheel's hash (a lock made by `make env-lock`)
    pip checks each file against its hashes before it installs any (--require-hashes)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(requirement_lines(lock)) + "\n")
    return handle.name


def build(
    lock: dict, env_dir: str, python: str, files: dict, timeout: int, check: Callable[[], None]
) -> dict:
    """Build envs/<lock id>; whatever ends it early (pip failing, the disk full or under its
    reserve, the play gone) removes the unfinished env, which no run could use."""
    if os.path.exists(env_dir):
        shutil.rmtree(env_dir)
    try:
        return install(lock, env_dir, python, files, timeout, check)
    except BaseException:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise


def install(
    lock: dict, env_dir: str, python: str, files: dict, timeout: int, check: Callable[[], None]
) -> dict:
    run_checked(
        [python, "-m", "venv", "--without-pip", env_dir], 300, "creating the venv", check=check
    )
    env_python = os.path.join(env_dir, "bin", "python")
    reqs = requirements_file(lock)
    workdir = tempfile.mkdtemp(prefix=".installer-", dir=os.path.dirname(env_dir))
    try:
        # The lock alone decides what is installed: no user or site configuration.
        cmd, env, what = install_command(lock, env_python, files, workdir)
        run_checked(
            [*cmd, "-r", reqs], timeout, what, env=env, check=check, timeout_name="pip_timeout"
        )
    finally:
        os.unlink(reqs)
        shutil.rmtree(workdir, ignore_errors=True)
    drift = version_drift(lock, installed_versions(env_dir))
    if drift:
        raise EnvError(f"after installing, the env differs from the lock: {drift}")
    versions = check_runtime(lock, env_python)
    check()  # pip may have ended between two checks: the reserve is judged on what it left
    with open(os.path.join(env_dir, ENV_MARKER), "w", encoding="utf-8") as handle:
        json.dump({"lock_id": lock_id(lock), "lock": lock, "versions": versions}, handle, indent=2)
    return versions


def pin_lines(python: object, pins: dict[str, str | None]) -> str:
    """An env as text for a diff: its Python, then one `name==version` line per package."""
    lines = [f"python {python}"] if python else []
    lines += [f"{name}=={version}" for name, version in sorted(pins.items()) if version]
    return "\n".join(lines) + "\n"


def deployed_lock(root: str) -> tuple[str | None, dict | None]:
    """(lock id, lock) the deployment of `current` recorded in history.jsonl, if any."""
    release, _link = current_release(root)
    history = read_history(root)
    index = deployment_index(history, release)
    if index is None:
        return None, None
    lock = history[index].get("lock")
    return history[index].get("lock_id"), lock if isinstance(lock, dict) else None


def explain(root: str, lock: dict, lid: str, env_dir: str, drift: list[dict], check: bool) -> dict:
    """msg and diff of a build of envs/<lid>: against the drifted env itself, or against the env
    the current deployment uses."""
    built = "would be built" if check else "built"
    wanted = pinned(lock)
    after = pin_lines(lock.get("python"), wanted)
    if drift:
        installed: dict[str, str | None] = dict(wanted)
        installed.update({item["package"]: item["found"] for item in drift})
        moved = pin_changes(installed, wanted)
        return {
            "msg": f"envs/{lid} differs from its lock ({'; '.join(moved)}): {built} again",
            "diff": {
                "before_header": f"{env_dir} (as installed)",
                "after_header": f"{env_dir} (the lock)",
                "before": pin_lines(lock.get("python"), installed),
                "after": after,
            },
        }
    old_id, old_lock = deployed_lock(root)
    if old_lock is None:
        return {
            "msg": f"envs/{lid} {built}: {len(wanted)} pinned wheels, no env deployed before",
            "diff": {
                "before_header": f"{env_dir} (absent)",
                "after_header": f"{env_dir} ({'to be built' if check else 'built'})",
                "before": "",
                "after": after,
            },
        }
    if old_id == lid:  # the current deployment's own env, its folder gone
        return {
            "msg": f"envs/{lid} of the current deployment was missing: {built} again in its "
            f"place from the same lock ({len(wanted)} pinned wheels)",
            "diff": {
                "before_header": f"{env_dir} (missing)",
                "after_header": f"{env_dir} ({'to be built' if check else 'built'})",
                "before": "",
                "after": after,
            },
        }
    moved = pin_changes(pinned(old_lock), wanted)
    if str(old_lock.get("python")) != str(lock.get("python")):
        moved.insert(0, f"python {old_lock.get('python')} -> {lock.get('python')}")
    return {
        "msg": f"envs/{lid} {built} next to envs/{old_id} of the current deployment: "
        f"{'; '.join(moved) or 'same pins, another source'}",
        "diff": {
            "before_header": f"{os.path.join(root, 'envs', str(old_id))} (current deployment)",
            "after_header": f"{env_dir} ({'to be built' if check else 'built'})",
            "before": pin_lines(old_lock.get("python"), pinned(old_lock)),
            "after": after,
        },
    }


def adopt(lock: dict, env_dir: str, check_mode: bool) -> dict:
    """An existing interpreter as the env: checked against the pins (preflight did it before
    any change, this proves it again), recorded in envs/<lock-id>/, never installed into."""
    python = str(adopts(lock))
    versions = check_adopted(lock)
    marker = os.path.join(env_dir, ENV_MARKER)
    result = {
        "python": python,
        "versions": versions,
        "changed": not os.path.isfile(marker),
        "msg": f"{python} holds every pin of the lock (adopted as it is, never changed)",
    }
    if result["changed"] and not check_mode:
        os.makedirs(env_dir, exist_ok=True)
        with open(marker, "w", encoding="utf-8") as handle:
            json.dump({"lock_id": lock_id(lock), "lock": lock, "adopted": python,
                       "versions": versions}, handle, indent=2)  # fmt: skip
    return result


def run(module: AnsibleModule) -> dict:
    lock, root = module.params["lock"], module.params["root"]
    # Whether an unhashed lock may be deployed is preflight's question (before any change);
    # a recorded one (a rollback's) is installed as it was, with its hashes where it has them.
    problems = lock_problems(lock, unhashed_ok=True)
    if problems:
        raise EnvError("; ".join(problems))
    lid = lock_id(lock)
    env_dir = os.path.join(root, ENVS, lid)
    result = {
        "changed": False,
        "lock_id": lid,
        "env_dir": env_dir,
        "python": os.path.join(env_dir, "bin", "python"),
        "drift": [],
        "msg": f"envs/{lid} holds exactly the locked wheels",
    }
    if adopts(lock):
        result.update(adopt(lock, env_dir, module.check_mode))
        return result
    python = find_python(str(lock["python"]))
    source = lock["source"]
    files = check_wheelhouse(lock, source["wheelhouse"]) if source.get("wheelhouse") else {}
    if os.path.isfile(os.path.join(env_dir, ENV_MARKER)):
        result["drift"] = version_drift(lock, installed_versions(env_dir))
        if not result["drift"]:
            return result
    result["changed"] = True
    result.update(explain(root, lock, lid, env_dir, result["drift"], module.check_mode))
    if module.check_mode:
        return result
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    token = module.params["token"]
    if token:
        fence(root, token, phase="environment")
    # A build dies with the play that asked for it (the watchdog), never left as an orphan,
    # and stops before the disk is so full that the running trainer could not write.
    guard = DiskGuard(root, module.params["disk_reserve_mb"] * MB)
    guard.check()

    def check() -> None:
        dog.check()
        guard.check()

    with Watchdog(root, token) as dog:
        try:
            result["versions"] = build(
                lock, env_dir, python, files, module.params["pip_timeout"], check
            )
        except DiskSpaceError as err:
            raise DiskSpaceError(f"the build of {env_dir} (removed) {err}") from err
        except (CommandError, OSError) as err:  # pip's own "No space left" is in its output
            if is_disk_full(err) or "No space left" in str(err):
                raise DiskSpaceError(
                    f"the build of {env_dir} failed and was removed: "
                    + disk_full_message(root, "No space left on device")
                ) from err
            raise
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            lock={"type": "dict", "required": True},
            pip_timeout={"type": "int", "default": 1800},
            disk_reserve_mb={"type": "int", "default": 1024},
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except (EnvError, CommandError, LockError, DiskSpaceError) as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
