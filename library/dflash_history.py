#!/usr/bin/python
# The deployments of a target, and what changed between two of them; never changes anything.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_history
short_description: List the deployments of a target and compare two of them
description:
  - Read-only. Returns every line of C(history.jsonl) as a numbered deployment (time, action,
    release, tree hash, lock id, GPU layout, trainer args, result, tokens/s).
  - With I(diff_from) and I(diff_to), also what changed between the two deployments they
    select - files added, removed and changed (with the text diff when both releases are still
    on the target), environment versions, run.sh values, GPU layout and throughput.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
options:
  diff_from:
    description:
      - The older side of the diff. C(current) (the deployment that made current current),
        C(previous) (the newest healthy or staged one before it that ran other code, env or
        run.sh),
        C(fastest) (the healthy one with the most tokens/s), C(last) (the newest deploy or
        rollback line, whatever its result), a number as listed, or a release id (its newest
        deployment). Export lines are listed but never a side of a diff.
    type: str
  diff_to:
    description: The newer side of the diff, with the same selectors.
    type: str
attributes:
  check_mode:
    support: full
    details: Reads only; runs the same in check mode.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: What changed since the last healthy deployment
  dflash_history:
    root: /opt/dflash
    diff_from: previous
    diff_to: current
"""

RETURN = r"""
deployments:
  description:
    - The lines of history.jsonl (deployments, exports, the supervisor's restarts), oldest
      first, numbered from 1.
    - A deployment whose run folder holds a supervisor.json also has C(goodput) (C(wall_s),
      C(productive_s), C(ratio), C(badput_s) by cause) and C(restarts) (their count).
  type: list
  elements: dict
  returned: always
current:
  description: The release C(current) points at.
  type: str
  returned: always
diff:
  description: from, to (summaries), files (added, removed, changed, text), changes (section,
    name, from, to for release, environment, run_sh and layout) and throughput (from, to, ratio).
  type: dict
  returned: when diff_from and diff_to are given
damaged:
  description:
    - The lines of history.jsonl that are not a JSON record (line from 1, bytes, text), each
      also a warning; they are skipped, and the numbers of I(deployments) count records only.
  type: list
  elements: dict
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_history import (
    SelectorError,
    compare,
    listing,
    select,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import DEPLOY_ACTIONS
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    HISTORY,
    SUPERVISOR,
    current_release,
    read_history_checked,
    read_json,
    release_file_reader,
    release_manifests,
    run_path,
)


def damage_warnings(root: str, damaged: list[dict]) -> list[str]:
    """One sentence per line of history.jsonl that is not a record (skipped by every reader)."""
    return [
        f"{os.path.join(root, HISTORY)} line {item['line']} is damaged ({item['bytes']} bytes, "
        f"{item['text']!r}...): not a JSON record, so it is skipped; a writer was cut short or "
        "the file was edited. Move that line to history.jsonl.torn (the next deploy does so "
        "for a torn last line) to silence this"
        for item in damaged
    ]


def run(params: dict) -> dict:
    root = params["root"]
    history, damaged = read_history_checked(root)
    current, _link = current_release(root)
    rows = listing(history)
    for row, entry in zip(rows, history, strict=True):
        # The goodput of a deployment's run, as its supervisor last wrote it (a run folder
        # removed by hand, or a run from before supervision, has none).
        if entry.get("action", "deploy") in DEPLOY_ACTIONS and entry.get("run_id"):
            record = read_json(run_path(root, entry["run_id"], SUPERVISOR)) or {}
            row["goodput"] = record.get("goodput")
            row["restarts"] = (record.get("restarts") or {}).get("count")
    result = {"changed": False, "deployments": rows, "current": current, "damaged": damaged}
    if params["diff_from"] or params["diff_to"]:
        old = select(history, current, params["diff_from"] or "previous")
        new = select(history, current, params["diff_to"] or "current")
        result["diff"] = compare(
            history, old, new, release_manifests(root), release_file_reader(root)
        )
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=False,
            diff_from={"type": "str"},
            diff_to={"type": "str"},
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params)
        for warning in damage_warnings(module.params["root"], result["damaged"]):
            module.warn(warning)
        module.exit_json(**result)
    except SelectorError as err:
        module.fail_json(msg=f"{module.params['root']}: {err}")


if __name__ == "__main__":
    main()
