# A check's outcome in one task, in the controller's own process: what refuses the run, what it
# warns about and what it says. One task instead of an assert, a warning and a debug task: each
# task costs every host a worker process, which is what a play of many hosts pays for.
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
---
module: dflash_check
short_description: Refuse, warn and say, in one controller-side task
description:
  - Runs on the controller only; nothing goes to the target and nothing changes.
  - Fails when O(problems) has any message (the messages joined, in order, are its C(msg)).
    Each of O(warnings) becomes a C([WARNING]) line. O(notes) are shown as a C(debug) task's
    message is, by the dflash stdout callback.
options:
  problems:
    description: What refuses the run; the task fails with these, joined by a space.
    type: list
    elements: str
    default: []
  warnings:
    description: What the user should know, shown as warnings (also when the task fails).
    type: list
    elements: str
    default: []
  notes:
    description: What the run did or found that is no warning; the result's C(msg).
    type: list
    elements: str
    default: []
author: dflash-deploy
"""

RETURN = r"""
msg:
  description: The problems joined (failed), else the note (one) or the notes (several).
  returned: when there are problems or notes
  type: raw
"""


# Each option a list of messages (empty by default), as DOCUMENTATION says.
ARGUMENT_SPEC = {
    name: {"type": "list", "elements": "str", "default": []}
    for name in ("problems", "warnings", "notes")
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        if args["warnings"]:
            result["warnings"] = args["warnings"]
        if args["problems"]:
            result.update(failed=True, msg=" ".join(args["problems"]))
        elif args["notes"]:
            notes = args["notes"]
            # Shown without -v, as a debug task's message is.
            result.update(msg=notes[0] if len(notes) == 1 else notes, _ansible_verbose_always=True)
        return result
