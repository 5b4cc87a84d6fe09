# The action side of the dflash_unpack module (library/dflash_unpack.py documents its options).
# With src, the archive is sent first: over a connection that pipelines, one shell command takes
# it on its standard input, so push and unpack cost two round trips instead of nine (a folder,
# copy's stat, temp folder, put, chmod, module and clean-up), and the archive never travels
# inside a task's arguments (a worker of a killed ansible-playbook blocks forever sending back
# a task result over 64 KiB). Otherwise it goes through Ansible's temp folder.
from __future__ import annotations

import os
import shlex

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    # No temp folder up front: the streamed push needs none; the fallback makes its own.
    TRANSFERS_FILES = False

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        src = args.pop("src", None)
        if src is None or self._task.check_mode:
            # Check mode reports what the module would do; nothing is sent.
            result.update(self._execute_module("dflash_unpack", module_args=args,
                                               task_vars=task_vars))  # fmt: skip
            return result
        if not args.get("archive"):
            raise AnsibleActionFail("dflash_unpack: src needs archive, the path to push it to")
        try:
            src = self._find_needle("files", src)  # a relative path as copy finds it
            with open(src, "rb") as source:
                data = source.read()
        except (OSError, AnsibleError) as err:
            raise AnsibleActionFail(f"cannot read the release archive {src}: {err}") from err
        if self._is_pipelining_enabled("new"):
            self._stream(data, args["archive"])
        else:
            tmp_dir = self._make_tmp_path()
            staged = self._connection._shell.join_path(tmp_dir, os.path.basename(src))
            self._transfer_file(src, staged)
            self._fixup_perms2((tmp_dir, staged))
            args["archive"] = staged
        # The temp folder of the fallback goes with the action's cleanup().
        result.update(self._execute_module("dflash_unpack", module_args=args,
                                           task_vars=task_vars))  # fmt: skip
        return result

    def _stream(self, data: bytes, archive: str) -> None:
        """One command on the target writes the archive from stdin; a partial one (a kill
        halfway) stays under .part, never under the name the module reads."""
        path = shlex.quote(archive)
        part = shlex.quote(archive + ".part")
        folder = shlex.quote(os.path.dirname(archive))
        cmd = f"mkdir -p {folder} && (umask 077 && cat > {part}) && mv -f {part} {path}"
        res = self._low_level_execute_command(cmd, in_data=data)
        if res["rc"] != 0:
            raise AnsibleActionFail(
                f"cannot push the release archive to {archive} (exit {res['rc']}): "
                f"{(res.get('stderr') or res.get('stdout') or '').strip()}"
            )
