#!/usr/bin/python
# Appends one deployment to history.jsonl, then prunes releases and envs beyond keep-N.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_record
short_description: Record a deployment or an export in history.jsonl and keep N releases
description:
  - "Appends one line to C(history.jsonl): time, action, release, tree hash, where the code came
    from, the previous release, the result and what the caller adds (lock, run.sh, run id,
    tokens/s, controller)."
  - Idempotent. No line is written when history already says this is what is deployed (the
    same trainer run, or the same release, tree, run.sh and env as the newest deployment
    line), unless this run repaired something (I(steps_changed)); the launch writes the line
    of a healthy trainer itself, so a run killed after the launch loses nothing.
  - Then removes releases beyond the I(keep) most recent healthy deployments, never the current
    release, the previous healthy deployment (the default rollback target), any in
    I(protect) nor any that history does not name (C(kept_unknown)); and envs that no kept
    release's deployment used.
  - An C(export) line (a drafter exported with the code of the current release) records no
    run.sh and prunes nothing.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
  - dflash_deploy_lock_token.takes_the_lock
options:
  release:
    description: Release the line is about.
    type: str
    required: true
  action:
    description: What happened.
    type: str
    choices: [deploy, rollback, export]
    default: deploy
  result:
    description: How it ended (C(exported) for an export).
    type: str
    choices: [deployed, healthy, failed, rolled_back, exported]
    required: true
  previous:
    description: Release that was current before.
    type: str
  run_sh_text:
    description: run.sh as that deployment rendered it, when the file on disk is no longer it
      (a release rolled back by the health check); default the file on disk.
    type: str
  record:
    description: Extra fields for the line.
    type: dict
    default: {}
  keep:
    description: Healthy deployments whose releases are kept (at least 1).
    type: int
    default: 5
  protect:
    description: Releases never pruned.
    type: list
    elements: str
    default: []
  launch_recorded:
    description: Whether this run's launch already wrote the line (a healthy trainer it started).
    type: bool
    default: false
  steps_changed:
    description:
      - Whether this run's steps changed the target (a release unpacked, an env built, run.sh
        rendered, current switched, a cache prepared or warmed). When they did and the launch
        wrote no line, a deployment that history already has gets a line anyway, with
        C(repaired) set to the run's C(why) (in I(record)) - a repair (run.sh rendered again,
        an env rebuilt) is a change and has its line.
    type: bool
    default: false
  release_lock:
    description:
      - Give the deploy lock of I(token) up once the line is written and keep-N is done, in
        the same call (the last step of a deploy or rollback, one round trip fewer than a
        separate release). A failed record keeps it, for the play's own release.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Record the deployment
  dflash_record:
    root: /opt/dflash
    release: v1.4.0
    result: healthy
    record:
      run_id: 20261130T120000Z-v1.4.0
"""

RETURN = r"""
history_entry:
  description: The line appended to history.jsonl (null when history already had it).
  type: dict
  returned: success
recorded:
  description: Whether a line was written.
  type: bool
  returned: success
pruned:
  description: Releases removed by keep-N.
  type: list
  elements: str
  returned: success
pruned_envs:
  description:
    - Envs removed because no kept release's deployment used them; none while a kept release
      is unknown to history (its env is not known either).
  type: list
  elements: str
  returned: success
kept_unknown:
  description:
    - Releases on the target that no line of history names (history lost or cut short, or a
      run killed before its record), kept by keep-N rather than deleted.
  type: list
  elements: str
  returned: success
lock_released:
  description: Whether this call gave the deploy lock up (I(release_lock)).
  type: bool
  returned: success
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    disk_full_message,
    is_disk_full,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, held
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    release as give_lock_up,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_record import (
    history_entry,
    line_for,
    record_once,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    ENVS,
    StateError,
    current_release,
    list_releases,
    previous_deployment,
    read_history,
    read_manifest,
    release_dir,
    releases_to_prune,
    remove_tree,
    unknown_releases,
)

NOTHING_PRUNED = {"pruned": [], "pruned_envs": [], "kept_unknown": []}


def envs_to_prune(root: str, history: list[dict], kept: list[str]) -> list[str]:
    """Envs that no deployment of a kept release used (the env of current is always in use)."""
    folder = os.path.join(root, ENVS)
    if not os.path.isdir(folder):
        return []
    used = {e.get("lock_id") for e in history if e.get("release") in kept}
    return sorted(
        name for name in os.listdir(folder) if name not in used and not name.startswith(".")
    )


def prune(root: str, release: str, keep: int, protect: list[str]) -> tuple[list, list, list]:
    """keep-N: releases beyond the newest good ones, then envs no kept release used; and the
    releases kept because history does not name them."""
    history = read_history(root)
    available = list_releases(root)
    current, _link = current_release(root)
    protected = {r for r in (current, release, *protect) if r}
    fallback = previous_deployment(history, current, available)
    if fallback:
        protected.add(fallback)
    pruned, pruned_envs = [], []
    for doomed in releases_to_prune(history, available, keep, protected):
        remove_tree(release_dir(root, doomed))
        pruned.append(doomed)
    kept = list_releases(root)
    unknown = unknown_releases(history, kept)
    # Envs are pruned only when history says which env each kept release used.
    if not unknown and all(e.get("lock_id") for e in history if e.get("release") in kept):
        for env in envs_to_prune(root, history, kept):
            shutil.rmtree(os.path.join(root, ENVS, env))
            pruned_envs.append(env)
    return pruned, pruned_envs, unknown


def run(module: AnsibleModule) -> dict:
    params = module.params
    root, release = params["root"], params["release"]
    if params["keep"] < 1:
        raise StateError(f"keep={params['keep']} would prune the current release; use keep >= 1")
    manifest = read_manifest(release_dir(root, release))
    if manifest is None and module.check_mode:
        # Not unpacked in check mode: a real run would have, and would record it.
        return {"changed": True, "recorded": True, **NOTHING_PRUNED}
    if manifest is None:
        raise StateError(f"release {release} is not under {root}/releases; nothing to record")
    entry = history_entry(
        root, manifest, params["record"], release=release, action=params["action"],
        result=params["result"], previous=params["previous"], run_sh_text=params["run_sh_text"],
    )  # fmt: skip
    # A run whose steps changed the target, and whose launch wrote no line: a repair.
    repairs = params["steps_changed"] and not params["launch_recorded"]
    if module.check_mode:
        # What the target shows now (run.sh as it is): whether history would get a line.
        fresh = line_for(read_history(root), entry, repairs) is not None
        return {"changed": fresh, "recorded": fresh, **NOTHING_PRUNED}
    with held(root, params["token"], params["action"], "record"):
        written = record_once(root, entry, repairs)
        # An export changes no release: keep-N has nothing new to do.
        pruned, pruned_envs, unknown = (
            ([], [], []) if params["action"] == "export"
            else prune(root, release, params["keep"], params["protect"])
        )  # fmt: skip
    return {
        "changed": written or bool(pruned or pruned_envs),
        "history_entry": entry if written else None,
        "recorded": written,
        "pruned": pruned,
        "pruned_envs": pruned_envs,
        "kept_unknown": unknown,
        "lock_released": bool(params["release_lock"] and params["token"])
        and give_lock_up(root, params["token"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            release={"type": "str", "required": True},
            action={
                "type": "str",
                "choices": ["deploy", "rollback", "export"],
                "default": "deploy",
            },
            result={
                "type": "str",
                "choices": ["deployed", "healthy", "failed", "rolled_back", "exported"],
                "required": True,
            },
            previous={"type": "str"},
            run_sh_text={"type": "str"},
            record={"type": "dict", "default": {}},
            keep={"type": "int", "default": 5},
            protect={"type": "list", "elements": "str", "default": []},
            launch_recorded={"type": "bool", "default": False},
            steps_changed={"type": "bool", "default": False},
            release_lock={"type": "bool", "default": False},
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except (StateError, LockError) as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        if not is_disk_full(err):
            raise
        module.fail_json(
            msg=f"history.jsonl not written: {disk_full_message(module.params['root'], err)}"
        )


if __name__ == "__main__":
    main()
