#!/usr/bin/python
# Appends one deployment to history.jsonl, then prunes releases and envs beyond keep-N.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_record
short_description: Record a deployment or an export in history.jsonl and keep N releases
description:
  - Appends one line to C(history.jsonl) (time, action, release, tree hash, where the code came
    from, the previous release, the result and what the caller adds - lock, run.sh, run id,
    tokens/s, controller).
  - Then removes releases beyond the I(keep) most recent healthy deployments, never the current
    release, the previous healthy deployment (the default rollback target) nor any in
    I(protect); and envs that no kept release's deployment used.
  - An C(export) line (a drafter exported with the code of the current release) records no
    run.sh and prunes nothing.
options:
  root:
    description: State root on the target.
    type: path
    required: true
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
  description: The line appended to history.jsonl.
  type: dict
  returned: success
pruned:
  description: Releases removed by keep-N.
  type: list
  elements: str
  returned: success
pruned_envs:
  description: Envs removed because no kept release's deployment used them.
  type: list
  elements: str
  returned: success
"""

import os
import shutil
from datetime import UTC, datetime

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dflash_release import sha256_bytes
from ansible.module_utils.dflash_state import (
    StateError,
    append_history,
    current_release,
    deploy_lock,
    list_releases,
    previous_deployment,
    read_history,
    read_manifest,
    read_run_script,
    release_dir,
    releases_to_prune,
    remove_tree,
)


def history_entry(params: dict, manifest: dict) -> dict:
    # Where the code came from is in the release's manifest; the caller adds the rest.
    entry = {key: manifest.get(key) for key in ("ref", "commit", "dirty")}
    entry.update(params["record"])
    # run.sh as deployed: its hash, and its text so a rollback can restore it exactly (an
    # export runs no run.sh: the deployment's own line has it).
    text = params["run_sh_text"]
    if params["action"] != "export" and text is None:
        run_sh = read_run_script(params["root"])
        entry.update(run_sh_sha256=run_sh["sha256"], run_sh_text=run_sh["content"])
    elif params["action"] != "export":
        entry.update(run_sh_sha256=sha256_bytes(text.encode()), run_sh_text=text)
    entry.update(
        time=datetime.now(UTC).isoformat(timespec="seconds"),
        action=params["action"],
        release=params["release"],
        tree_sha256=manifest.get("tree_sha256"),
        previous=params["previous"],
        result=params["result"],
    )
    return entry


def envs_to_prune(root: str, history: list[dict], kept: list[str]) -> list[str]:
    """Envs that no deployment of a kept release used (the env of current is always in use)."""
    folder = os.path.join(root, "envs")
    if not os.path.isdir(folder):
        return []
    used = {e.get("lock_id") for e in history if e.get("release") in kept}
    return sorted(
        name for name in os.listdir(folder) if name not in used and not name.startswith(".")
    )


def run(module: AnsibleModule) -> dict:
    params = module.params
    root, release = params["root"], params["release"]
    if params["keep"] < 1:
        raise StateError(f"keep={params['keep']} would prune the current release; use keep >= 1")
    if module.check_mode:
        # The release may not be unpacked in check mode; a real run would write one line.
        return {"changed": True, "pruned": [], "pruned_envs": []}
    manifest = read_manifest(release_dir(root, release))
    if manifest is None:
        raise StateError(f"release {release} is not under {root}/releases; nothing to record")
    entry = history_entry(params, manifest)
    result = {"changed": True, "history_entry": entry, "pruned": [], "pruned_envs": []}
    with deploy_lock(root):
        append_history(root, entry)
        if params["action"] == "export":
            return result  # exports change no release: keep-N has nothing new to do
        history = read_history(root)
        available = list_releases(root)
        current, _link = current_release(root)
        protected = {r for r in (current, release, *params["protect"]) if r}
        fallback = previous_deployment(history, current, available)
        if fallback:
            protected.add(fallback)
        for doomed in releases_to_prune(history, available, params["keep"], protected):
            remove_tree(release_dir(root, doomed))
            result["pruned"].append(doomed)
        kept = list_releases(root)
        # Envs are pruned only when history says which env each kept release used.
        if all(e.get("lock_id") for e in history if e.get("release") in kept):
            for env in envs_to_prune(root, history, kept):
                shutil.rmtree(os.path.join(root, "envs", env))
                result["pruned_envs"].append(env)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "action": {
                "type": "str",
                "choices": ["deploy", "rollback", "export"],
                "default": "deploy",
            },
            "result": {
                "type": "str",
                "choices": ["deployed", "healthy", "failed", "rolled_back", "exported"],
                "required": True,
            },
            "previous": {"type": "str"},
            "run_sh_text": {"type": "str"},
            "record": {"type": "dict", "default": {}},
            "keep": {"type": "int", "default": 5},
            "protect": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except StateError as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
