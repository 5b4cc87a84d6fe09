# async_status, and while the job runs, how far the trainer it starts has got: the health
# wait's polls read runs/latest/status.json on the target too, so its progress lines (the dflash
# stdout callback) say `step 3 of 5`. Ansible's async job file holds nothing but started and
# finished until the module ends.
from __future__ import annotations

import base64
import json
from typing import Any

from ansible.plugins.action.async_status import ActionModule as AsyncStatus

DOCUMENTATION = r"""
---
module: dflash_wait
short_description: Poll a background job (async_status), with a trainer's training steps
description:
  - C(ansible.builtin.async_status) (its O(jid) and O(mode), its result) and, while the job is
    not finished, what the trainer named by O(progress) has got to, read from its
    C(status.json) on the target, as C(progress), e.g. C(step 3 of 5). A status that cannot be
    read, or is another release's, leaves C(progress) out.
options:
  jid:
    description: The job id, as async_status takes it.
    type: str
    required: true
  mode:
    description: As async_status.
    type: str
    choices: [status, cleanup]
    default: status
  progress:
    description: The trainer the job starts.
    type: dict
    suboptions:
      status:
        description: Path of its C(status.json) on the target (C(<root>/runs/latest/status.json)).
        type: str
        required: true
      release:
        description: The release it runs; a status of another release is an old run's.
        type: str
        required: true
      steps:
        description: The training steps the job waits for.
        type: int
        required: true
author: dflash-deploy
"""


def trainer_progress(status: dict[str, Any], release: str, steps: int) -> str | None:
    """`step 3 of 5` for a running trainer of `release`, counted as the health check counts
    (steps of this run, after the step a checkpoint resumed from), or None."""
    if status.get("release") != release or status.get("state") != "running":
        return None
    done = (status.get("step") or 0) - (status.get("resumed_from_step") or 0)
    return f"step {max(done, 0)} of {steps}"


class ActionModule(AsyncStatus):
    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        args = dict(self._task.args)
        progress = args.pop("progress", None)
        # async_status validates its own arguments: it is given them without ours.
        kept, self._task.args = self._task.args, args
        try:
            result = super().run(tmp, task_vars)
        finally:
            self._task.args = kept
        if progress and not result.get("finished") and not result.get("failed"):
            read = self._execute_module(
                module_name="ansible.legacy.slurp",
                module_args={"src": progress["status"]},
                task_vars=task_vars,
            )
            try:
                status = json.loads(base64.b64decode(read["content"]))
            except (KeyError, ValueError):
                # No status.json yet (the trainer is starting), or one being rewritten.
                status = {}
            said = trainer_progress(status, str(progress["release"]), int(progress["steps"]))
            if said:
                result["progress"] = said
        return result
