#!/usr/bin/python
# The target side of a wait on a background job: it waits on the target and returns as soon as
# the job ends, so a health wait ends with its health check instead of at the next poll.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_wait
short_description: Wait for a background job to finish, saying how far its trainer has got
description:
  - Waits on the target, up to O(wait_s) seconds, for the background job O(jid) (a task with
    C(async) and a C(poll) of 0) to finish, reading its job file as C(ansible.builtin.async_status)
    does, and returns as soon as it has; a task retries it (C(until)) with no delay. The wait
    thus ends within a fraction of a second of the job, where a poll every few seconds would
    add half its interval on average, and each retry is one module run instead of two.
  - Its action side (action_plugins/dflash_wait.py) finds the job file's folder (the shell's
    C(async_dir)), and once the job has finished returns its result through
    C(ansible.builtin.async_status) (the job's own result, C(finished), C(ansible_job_id)).
  - While the job runs, C(progress) says what the trainer named by O(progress) has got to, read
    from its C(status.json), e.g. C(step 3 of 5); a status that cannot be read, or is another
    release's, leaves it out.
  - With O(root) and O(token), each run proves the run still holds the deploy lock and notes
    in it that its play reached the target now, so a background job of a play that stopped
    polling it (killed) sees that and changes nothing more (M(dflash_launch), its
    C(poll_timeout_s)). Fails once the lock is no longer this run's. Not in check mode.
options:
  root:
    description: The state root whose deploy lock this run holds (read with O(token) only).
    type: path
  token:
    description: The deploy lock's token of this run (M(dflash_deploy_lock)).
    type: str
  jid:
    description: The job id, as C(ansible.builtin.async_status) takes it.
    type: str
    required: true
  async_dir:
    description: The folder of the job files on the target; the action side sets it.
    type: path
    required: true
  wait_s:
    description: The most seconds one run waits before it returns (a progress line each time).
    type: float
    default: 5.0
  progress:
    description: The trainer the job starts.
    type: dict
    suboptions:
      status:
        description: Path of its C(status.json) on the target (C(<root>/runs/latest/status.json)).
        type: path
        required: true
      release:
        description: The release it runs; a status of another release is an old run's.
        type: str
        required: true
      steps:
        description: The training steps the job waits for.
        type: int
        required: true
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Start the launch in the background
  dflash_launch:
    release: v1.4.0
  async: 900
  poll: 0
  register: launch

- name: Wait for its health check, a progress line every 5 s
  dflash_wait:
    jid: "{{ launch.ansible_job_id }}"
    wait_s: 5
    progress:
      status: /opt/dflash/runs/latest/status.json
      release: v1.4.0
      steps: 5
  register: waited
  until: waited is finished
  retries: 200
  delay: 0
"""

RETURN = r"""
finished:
  description: Whether the job has finished; once it has, the rest is the job's own result.
  returned: always
  type: bool
progress:
  description: How far the trainer has got while the job runs.
  returned: when the job runs and its trainer's status is readable
  type: str
  sample: step 3 of 5
"""

import os
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, fence
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import read_json
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is

# How often the job file is read while waiting: a stat and a small read, nothing more.
CHECK_EVERY_S = 0.2


def job_finished(path: str) -> bool:
    """async_status's reading of a job file: the async wrapper writes `started` into it while
    the job runs and replaces it with the module's result when it ends (the file is there
    before the job is started, see async_wrapper). One caught mid-write is a running job; a
    missing one is over, for async_status to report (`could not find job`)."""
    if not os.path.exists(path):
        return True
    data = read_json(path)
    return isinstance(data, dict) and ("started" not in data or bool(data.get("finished")))


def trainer_progress(status: dict[str, Any], release: str, steps: int) -> str | None:
    """`step 3 of 5` for a running trainer of `release`, counted as the health check counts
    (steps of this run, after the step a checkpoint resumed from), or None."""
    if status.get("release") != release or not state_is(status, "stepping"):
        return None
    done = (status.get("step") or 0) - (status.get("resumed_from_step") or 0)
    return f"step {max(done, 0)} of {steps}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "jid": {"type": "str", "required": True},
            "root": {"type": "path"},
            "token": {"type": "str", "no_log": False},
            "async_dir": {"type": "path", "required": True},
            "wait_s": {"type": "float", "default": 5.0},
            "progress": {
                "type": "dict",
                "options": {
                    "status": {"type": "path", "required": True},
                    "release": {"type": "str", "required": True},
                    "steps": {"type": "int", "required": True},
                },
            },
        },
        supports_check_mode=True,
    )
    if module.params["root"] and module.params["token"] and not module.check_mode:
        try:  # the play is alive: its background job may go on (the lock's polled_epoch)
            fence(module.params["root"], module.params["token"])
        except LockError as err:
            module.fail_json(msg=str(err), finished=False)
    job = os.path.join(module.params["async_dir"], module.params["jid"])
    deadline = time.monotonic() + max(module.params["wait_s"], 0.0)
    finished = job_finished(job)
    while not finished and time.monotonic() < deadline:
        time.sleep(CHECK_EVERY_S)
        finished = job_finished(job)
    if finished:
        module.exit_json(changed=False, finished=True)
    result: dict[str, Any] = {"changed": False, "finished": False}
    progress = module.params["progress"]
    if progress:
        # No status.json yet (the trainer is starting), or one caught mid-write: nothing to say.
        status = read_json(progress["status"])
        said = trainer_progress(status if isinstance(status, dict) else {}, progress["release"],
                                progress["steps"])  # fmt: skip
        if said:
            result["progress"] = said
    module.exit_json(**result)


if __name__ == "__main__":
    main()
