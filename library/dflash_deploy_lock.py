#!/usr/bin/python
# The target side of the deploy lock: take it, give it up, or read it (docs/deploy-lock.md).
# The action plugin of the same name (roles/dflash_deploy_lock) decides on the controller
# whether a holder is dead and may be replaced.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_deploy_lock
short_description: Take, release or read the deploy lock of a dflash state root
description:
  - C(<root>/.deploy.lock) names the run that holds the state root (its ansible-playbook
    process, user, host, action, release, phase and when it last renewed the lock). One
    deploy, rollback or stop holds it at a time; the modules that change the state check the
    holder's token before each change.
  - Normally run through the action plugin of the same name (role dflash_deploy_lock), which
    adds the controller's identity, waits a bounded time for a busy lock and takes over the lock
    of a holder that is dead (its process is gone) or silent longer than allowed.
  - A deploy or rollback that takes the lock then removes what killed writers left under the
    root (RETURN C(cleaned) names each).
  - Creates the state root when it is missing (its parent must exist); a run that created it
    removes it again on release when nothing else was put there.
options:
  root:
    description: State root on the target (absolute, no whitespace, no C(..)).
    type: path
    required: true
  state:
    description:
      - C(acquired) takes the lock (or answers who holds it), C(released) gives it up (only the
        holder's token can), C(status) only reads it.
    type: str
    choices: [acquired, released, status]
    default: acquired
  token:
    description: The holder's token (the action plugin derives it from the controller's process).
    type: str
  holder:
    description: Who holds it (user, host, pid, pid_start, boot_id, pid_ns).
    type: dict
    default: {}
  action:
    description: What the holder does.
    type: str
    choices: [deploy, rollback, stop]
    default: deploy
  release:
    description:
      - The release the holder makes current, when known (a rollback's is noted when it switches
        C(current)); a run that takes the lock over after an interruption finishes that intent.
    type: str
  take_over:
    description: Token of a holder judged dead or expired; only that holder's lock is replaced.
    type: str
  expect_generation:
    description:
      - The lock's generation (how many times it was taken; C(dflash_facts) returns it as
        C(deploy_lock_generation)) that a read of the caller saw while the lock was free.
        RETURN C(unchanged_since_read) then says whether that read still holds.
    type: int
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
    details: In check mode only C(status) runs; the lock is read, never written.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Take the deploy lock (through the action plugin)
  dflash_deploy_lock:
    root: /opt/dflash
    action: deploy
"""

RETURN = r"""
acquired:
  description: Whether the lock is now held by I(token).
  type: bool
  returned: when state is acquired
held_by:
  description: The lock of another run, with C(age_s) (seconds since it was renewed).
  type: dict
  returned: when another run holds it
taken_over:
  description: The lock of the run that was replaced (its holder was dead or silent).
  type: dict
  returned: when a lock was taken over
lock:
  description: The lock document as it is now (state status, or the one just taken).
  type: dict
  returned: always
cleaned:
  description:
    - What killed writers had left under the root, one sentence each (temp files, pushed
      archives, envs whose build was cut short removed; a torn last line of history.jsonl
      moved to history.jsonl.torn). Done by a deploy or rollback that took the lock.
  type: list
  elements: str
  returned: when a deploy or rollback took the lock
unchanged_since_read:
  description:
    - Whether no other run took the lock between the read whose I(expect_generation) was given
      and this take (every change happens under the lock, so that read still describes the
      target); false when no I(expect_generation) was given.
  type: bool
  returned: when the lock was taken
released:
  description: Whether this call gave the lock up.
  type: bool
  returned: when state is released
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_leftovers import clean
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import DEPLOY_ACTIONS
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    acquire,
    read_lock,
    release,
    utc_now,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    append_history,
    current_release,
)


def root_problem(root: str) -> str | None:
    if not root.startswith("/") or re.search(r"\s", root) or re.search(r"(^|/)\.\.(/|$)", root):
        return "must be an absolute path without whitespace or '..'; e.g. dflash_root: /opt/dflash"
    parent = os.path.dirname(os.path.normpath(root))
    if not os.path.isdir(parent):
        return (
            f"its parent folder '{parent}' does not exist. Create it first, or point dflash_root "
            "at a folder under an existing one"
        )
    return None


def interrupted_line(lock: dict) -> dict:
    """history.jsonl's line for a deploy or rollback whose lock was taken over: what it was
    doing (its release, the one it left, the phase it reached), so history misses no attempt.
    The run that takes over finishes that intent and names it in its own line
    (`interrupted_run`)."""
    return {
        "time": utc_now(),
        "action": lock.get("action"),
        "result": "interrupted",
        "release": lock.get("release"),
        "previous": lock.get("from_release"),
        "phase": lock.get("phase"),
        "started": lock.get("started"),
        "by": {k: (lock.get("holder") or {}).get(k) for k in ("user", "host", "pid")},
    }


def run(module: AnsibleModule) -> dict:
    params = module.params
    root = params["root"]
    problem = root_problem(root)
    if problem:
        raise ValueError(f"dflash_root '{root}': {problem}")
    if params["state"] == "status" or module.check_mode:
        return {"changed": False, "lock": read_lock(root)}
    if not params["token"]:
        raise ValueError("token is required to take or release the lock")
    if params["state"] == "released":
        return {"changed": False, "released": release(root, params["token"]), "lock": None}
    try:
        got = acquire(
            root, params["token"], params["holder"], params["action"], params["release"],
            take_over=params["take_over"], from_release=current_release(root)[0],
            expect_generation=params["expect_generation"],
        )  # fmt: skip
    except OSError as err:
        raise ValueError(
            f"dflash_root '{root}' is not writable ({err.strerror}): the deploy lock and every "
            "release go there. Mount it writable, or point dflash_root at a writable folder"
        ) from err
    if got["acquired"] and params["action"] != "stop":
        # Holding the lock, nobody else writes these: what killed writers left goes now.
        got["cleaned"] = clean(root)
        previous = got.get("taken_over") or {}
        if previous.get("action") in DEPLOY_ACTIONS:
            append_history(root, interrupted_line(previous))
    # A lock is not a change of the deployed state: a no-op deploy stays changed=0.
    return {"changed": False, "lock": got.get("lock"), **got}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "state": {
                "type": "str",
                "choices": ["acquired", "released", "status"],
                "default": "acquired",
            },
            "token": {"type": "str"},
            "holder": {"type": "dict", "default": {}},
            "action": {
                "type": "str",
                "choices": ["deploy", "rollback", "stop"],
                "default": "deploy",
            },
            "release": {"type": "str"},
            "take_over": {"type": "str"},
            "expect_generation": {"type": "int"},
        },
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except ValueError as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
