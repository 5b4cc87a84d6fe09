#!/usr/bin/python
# Makes an unpacked release current, records the deployment in history.jsonl, prunes old ones.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_activate
short_description: Switch C(current) to a release atomically, record it, keep N releases
description:
  - Points C(current) at C(releases/<release>) through a temp link and a rename, so C(current)
    is never missing nor dangling, and appends one line to C(history.jsonl).
  - When the release is already current nothing is switched nor recorded (idempotent).
  - Then removes releases beyond the I(keep) most recently deployed ones, never the current
    release, the previous deployment (the default rollback target) nor any in I(protect).
options:
  root:
    description: State root on the target.
    type: path
    required: true
  release:
    description: Release id to make current.
    type: str
    required: true
  action:
    description: What is recorded in history.
    type: str
    choices: [deploy, rollback]
    default: deploy
  result:
    description: Result recorded in history for this deployment.
    type: str
    choices: [deployed, healthy, failed, rolled_back]
    default: deployed
  record:
    description: Extra fields for the history line (lock, run.sh values, controller, ...).
    type: dict
    default: {}
  keep:
    description: How many recently deployed releases to keep (at least 1).
    type: int
    default: 5
  protect:
    description: Releases never pruned (e.g. pinned rollback targets).
    type: list
    elements: str
    default: []
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Make the new release current
  dflash_activate:
    root: /opt/dflash
    release: v1.4.0
    record:
      ref: v1.4.0
    keep: 5
"""

RETURN = r"""
previous:
  description: Release that was current before.
  type: str
  returned: success
switched:
  description: Whether C(current) was switched.
  type: bool
  returned: success
pruned:
  description: Releases removed by keep-N.
  type: list
  elements: str
  returned: success
history_entry:
  description: The line appended to history.jsonl (absent when nothing was switched).
  type: dict
  returned: when switched
"""

import os
from datetime import UTC, datetime

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dflash_state import (
    StateError,
    append_history,
    current_release,
    deploy_lock,
    list_releases,
    previous_deployment,
    read_history,
    read_manifest,
    release_dir,
    releases_to_prune,
    remove_tree,
    switch_current,
)


def history_entry(params: dict, manifest: dict, previous: str | None) -> dict:
    # Where the code came from is in the release's manifest; the caller adds the rest.
    entry = {key: manifest.get(key) for key in ("ref", "commit", "dirty")}
    entry.update(params["record"])
    entry.update(
        time=datetime.now(UTC).isoformat(timespec="seconds"),
        action=params["action"],
        release=params["release"],
        tree_sha256=manifest["tree_sha256"],
        previous=previous,
        result=params["result"],
    )
    return entry


def run(module: AnsibleModule) -> dict:
    params = module.params
    root, release = params["root"], params["release"]
    if params["keep"] < 1:
        raise StateError(f"keep={params['keep']} would prune the current release; use keep >= 1")
    previous, _link = current_release(root)
    result: dict = {"changed": False, "previous": previous, "switched": False, "pruned": []}
    switching = previous != release
    result["diff"] = {"before": f"current -> {previous}\n", "after": f"current -> {release}\n"}
    if module.check_mode:
        # In check mode the release may not be unpacked yet: it would have been by now.
        result["changed"] = result["switched"] = switching
        return result
    manifest = read_manifest(release_dir(root, release))
    if manifest is None:
        raise StateError(
            f"release {release} is not unpacked under {root}/releases; deploy it first "
            f"(available: {', '.join(list_releases(root)) or 'none'})"
        )
    with deploy_lock(root):
        if switching:
            entry = history_entry(params, manifest, previous)
            switch_current(root, release)
            append_history(root, entry)
            result.update(changed=True, switched=True, history_entry=entry)
        history = read_history(root)
        available = list_releases(root)
        protected = {release, *params["protect"]}
        fallback = previous_deployment(history, release, available)
        if fallback:
            protected.add(fallback)
        for doomed in releases_to_prune(history, available, params["keep"], protected):
            remove_tree(release_dir(root, doomed))
            result["pruned"].append(doomed)
        result["changed"] = result["changed"] or bool(result["pruned"])
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "action": {"type": "str", "choices": ["deploy", "rollback"], "default": "deploy"},
            "result": {
                "type": "str",
                "choices": ["deployed", "healthy", "failed", "rolled_back"],
                "default": "deployed",
            },
            "record": {"type": "dict", "default": {}},
            "keep": {"type": "int", "default": 5},
            "protect": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    if not os.path.isdir(module.params["root"]):
        module.fail_json(msg=f"state root {module.params['root']} does not exist; deploy first")
    try:
        module.exit_json(**run(module))
    except StateError as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
