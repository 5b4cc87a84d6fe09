# A callback for the benchmarks: seconds spent in each role of a play, written as JSON to
# $DFLASH_ROLE_TIMES when the play ends. Stdlib and ansible-core only, so it runs where only
# ansible-core was carried (the GPU machine).
from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
---
name: dflash_role_times
type: aggregate
short_description: Seconds per role of a play, as JSON
description:
  - Adds up the wall time from each task's start to the next task's start by the role the
    task belongs to (tasks outside a role count as C(play)), and writes them to the file named
    by the environment variable C(DFLASH_ROLE_TIMES) at the end of the playbook.
requirements:
  - enable it with ANSIBLE_CALLBACKS_ENABLED=dflash_role_times
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dflash_role_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[str, float] = {}
        self.current: tuple[str, float] | None = None

    def _close(self) -> None:
        if self.current:
            role, started = self.current
            self.times[role] = self.times.get(role, 0.0) + time.monotonic() - started

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close()
        role = task._role.get_name() if task._role else "play"
        self.current = (role, time.monotonic())

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close()
        self.current = None
        path = os.environ.get("DFLASH_ROLE_TIMES")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({k: round(v, 2) for k, v in self.times.items()}, handle, indent=2)
