# Turns findings that are not errors (preflight's, a renamed variable's old name) into Ansible
# warnings ([WARNING] lines, and the result's `warnings`), in the controller's own process:
# nothing goes to the target.
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
---
module: dflash_warn
short_description: Show the toolkit's warnings as Ansible warnings
description:
  - Runs on the controller only. Each message becomes a C([WARNING]) line; the task never fails
    and never changes anything.
options:
  msgs:
    description: The warnings.
    type: list
    elements: str
    required: true
author: dflash-deploy
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("msgs",))

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        msgs = [str(m) for m in self._task.args.get("msgs") or []]
        result.update(changed=False, warnings=msgs, msg=f"{len(msgs)} warning(s)")
        return result
