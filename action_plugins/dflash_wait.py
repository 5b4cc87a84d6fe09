# The action side of the dflash_wait module (library/dflash_wait.py documents its options): the
# module waits on the target until the background job ends or wait_s passes; once the job has
# ended, its result comes through async_status as the job's own.
from __future__ import annotations

from typing import Any

from ansible.plugins.action.async_status import ActionModule as AsyncStatus


class ActionModule(AsyncStatus):
    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        # As the shell says it (~/.ansible_async): the module's path option expands the ~ on
        # the target, which saves async_status's round trip to ask the target for its home.
        async_dir = self.get_shell_option("async_dir", default="~/.ansible_async")
        args = dict(self._task.args, async_dir=async_dir)
        waited = self._execute_module(module_name="dflash_wait", module_args=args,
                                      task_vars=task_vars)  # fmt: skip
        if waited.get("failed") or not waited.get("finished"):
            waited.setdefault("ansible_job_id", args.get("jid"))
            return waited
        # async_status validates its own arguments: it is given the job id alone.
        kept, self._task.args = self._task.args, {"jid": args["jid"]}
        try:
            return super().run(tmp, task_vars)
        finally:
            self._task.args = kept
