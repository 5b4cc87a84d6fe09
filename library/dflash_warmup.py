#!/usr/bin/python
# Fills the compile cache of one drafter GPU (python -m dflash.warmup), as long work that ends
# with the play that asked for it.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_warmup
short_description: Compile the drafter step into the compile cache, on one GPU or the CPU
description:
  - Runs C(python -m dflash.warmup) of the release being deployed with
    C(TORCHINDUCTOR_CACHE_DIR) and C(TRITON_CACHE_DIR) set to the cache folder, for one drafter
    GPU (the role loops over them, one after another, so no two compilations race).
  - The warmup runs in the trainer's environment - I(env) as run.sh exports it, and of this
    module's own only C(PATH), C(HOME) and C(LANG), as the trainer gets them - because
    Inductor's cache keys read environment variables, so a variable only the warmup saw would
    make it compile graphs the trainer never finds.
  - The warmup checks its compiled step against the eager one (the canary, C(dflash/warmup.py)).
    When they disagree (exit 3) the cache is suspect - it is moved aside to
    C(<cache_dir>.failed-<UTC time>) with a C(FAILED.json) saying why, and the warmup runs once
    more on an empty folder. A cold warmup that disagrees too fails the task - the compiler, not
    the cache, is at fault.
  - The compile runs in its own process group and ends, as a whole, when its time is up or when
    the run that holds the deploy lock loses it or dies, so a killed deploy leaves no
    compilation running.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_deploy_lock_token
options:
  root:
    description: State root on the target (holds the deploy lock).
    type: path
    required: true
  python:
    description: The env's interpreter.
    type: path
    required: true
  code_dir:
    description: The release folder to import dflash from.
    type: path
    required: true
  cache_dir:
    description: The compile cache folder.
    type: path
    required: true
  flags:
    description: The trainer flags that shape the compiled step.
    type: list
    elements: str
    default: []
  env:
    description: The trainer's variables (C(dflash_trainer_env)), as run.sh exports them.
    type: dict
    default: {}
  gpu:
    description: The drafter GPU to warm; none warms the CPU.
    type: int
  timeout:
    description: Seconds the compilation may take.
    type: int
    default: 1800
  disk_reserve_mb:
    description:
      - Free space (MB) the compilation never takes from the cache's file system; it is stopped
        once less is free (0 = off).
    type: int
    default: 1024
attributes:
  check_mode:
    support: full
    details: Compiles nothing; reports that it would.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Warm GPU 4
  dflash_warmup:
    root: /opt/dflash
    python: /opt/dflash/envs/lock-0123/bin/python
    code_dir: /opt/dflash/releases/v1.4.0
    cache_dir: /opt/dflash/cache/0123456789abcdef
    flags: [--target-model, /models/qwen3-8b, --compile-drafter]
    env: {PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"}
    gpu: 4
"""

RETURN = r"""
seconds:
  description: How long the compilation took.
  type: float
  returned: when run
output:
  description: The last lines the warmup printed.
  type: str
  returned: when run
moved_aside:
  description: Where a cache that failed the canary was moved (then the warmup ran cold).
  type: str
  returned: when a cache was moved aside
"""

import os
import time
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    CACHE_SUSPECT_EXIT,
    move_aside,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    MB,
    DiskGuard,
    DiskSpaceError,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_guarded import (
    CommandError,
    run_checked,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lock_watchdog import Watchdog
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_runs import launch_env


def run(module: AnsibleModule) -> dict:
    params = module.params
    if module.check_mode:
        return {"changed": True}
    argv = [params["python"], "-m", "dflash.warmup", *params["flags"]]
    if params["gpu"] is not None:
        argv += ["--drafter-gpus", str(params["gpu"])]
    # As run.sh starts the trainer: its own variables, then the ones it exports itself.
    env = launch_env(
        **{name: str(value) for name, value in params["env"].items()}
        | {
            "TORCHINDUCTOR_CACHE_DIR": params["cache_dir"],
            "TRITON_CACHE_DIR": os.path.join(params["cache_dir"], "triton"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        },
    )
    what = "the warmup of " + (f"GPU {params['gpu']}" if params["gpu"] is not None else "the CPU")
    started = time.monotonic()
    # Compiled kernels can take gigabytes: the warmup stops before the running trainer's room.
    guard = DiskGuard(params["cache_dir"], params["disk_reserve_mb"] * MB)

    def check() -> None:
        dog.check()
        guard.check()

    with Watchdog(params["root"], params["token"]) as dog:
        out, aside = warm_with_canary(
            lambda: run_checked(
                argv, params["timeout"], what, env=env, check=check, cwd=params["code_dir"],
                timeout_name="dflash_compile_cache_warm_timeout",
            ),
            params["cache_dir"],
            what,
        )  # fmt: skip
    result = {
        "changed": True,
        "seconds": round(time.monotonic() - started, 1),
        "output": "\n".join(out.splitlines()[-10:]),
    }
    if aside:
        result["moved_aside"] = aside
    return result


def warm_with_canary(
    warmup: Callable[[], str], cache_dir: str, what: str
) -> tuple[str, str | None]:
    """The warmup's output, and where the cache went when its canary failed (exit 3): moved
    aside, then warmed once more on an empty folder; a cold failure is the compiler's."""
    try:
        return warmup(), None
    except CommandError as err:
        if err.returncode != CACHE_SUSPECT_EXIT:
            raise
        aside = move_aside(cache_dir, f"failed its canary: {err}")
    os.makedirs(cache_dir, mode=0o755)
    try:
        return warmup(), aside
    except CommandError as cold:
        if cold.returncode != CACHE_SUSPECT_EXIT:
            raise
        raise CommandError(
            f"{what} failed its canary on an empty cache too (the suspect one is kept in "
            f"{aside}): a compiled step disagrees with the eager one (the warmup's message "
            "says which), so the compiler, not the cache, is at fault; deploy without "
            "--compile-drafter or --compile-target, whichever it names (dflash_trainer_args), "
            f"or another torch. {cold}"
        ) from None


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            python={"type": "path", "required": True},
            code_dir={"type": "path", "required": True},
            cache_dir={"type": "path", "required": True},
            flags={"type": "list", "elements": "str", "default": []},
            env={"type": "dict", "default": {}},
            gpu={"type": "int"},
            timeout={"type": "int", "default": 1800},
            disk_reserve_mb={"type": "int", "default": 1024},
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except (CommandError, LockError, DiskSpaceError) as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
