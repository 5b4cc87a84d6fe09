#!/usr/bin/python
# Writes run.sh from content rendered on the controller, in one module call.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_runscript
short_description: Write run.sh with the given content and mode, atomically, in one call
description:
  - Writes I(content) to I(path) through a temp file in the same folder and a rename, so a
    kill leaves the old run.sh or the new one, never half of one. Nothing changes when the file
    already has this content and mode.
  - The content comes with the module's arguments (rendered on the controller, for example with
    the template lookup), so over a pipelining connection this is one round trip where
    M(ansible.builtin.template) takes seven (stat, temp folder, put, chmod, copy, clean-up).
    Meant for small files, as a task's arguments travel back in its result.
options:
  path:
    description: The file to write (the state root's C(run.sh)).
    type: path
    required: true
  content:
    description: The whole file.
    type: str
    required: true
  mode:
    description: Its permissions, octal.
    type: str
    default: "0755"
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Render run.sh
  dflash_runscript:
    path: /opt/dflash/run.sh
    content: "{{ lookup('ansible.builtin.template', 'run.sh.j2') }}"
"""

RETURN = r"""
sha256:
  description: SHA-256 of the content.
  type: str
  returned: always
"""

import hashlib
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    disk_full_message,
    is_disk_full,
)


def read(path: str) -> tuple[str | None, int | None]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read(), os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None, None


def write(path: str, content: str, mode: int) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "content": {"type": "str", "required": True},
            "mode": {"type": "str", "default": "0755"},
        },
        supports_check_mode=True,
    )
    path, content = module.params["path"], module.params["content"]
    try:
        mode = int(module.params["mode"], 8)
    except ValueError:
        module.fail_json(msg=f"mode {module.params['mode']!r} is not octal; use e.g. '0755'")
    before, before_mode = read(path)
    result: dict = {
        "changed": before != content or before_mode != mode,
        "sha256": hashlib.sha256(content.encode("utf-8", "surrogateescape")).hexdigest(),
    }
    if module._diff and before != content:
        result["diff"] = {"before": before or "", "after": content,
                          "before_header": path, "after_header": path}  # fmt: skip
    if result["changed"] and not module.check_mode:
        try:
            write(path, content, mode)
        except OSError as err:
            why = disk_full_message(os.path.dirname(path), err) if is_disk_full(err) else err
            module.fail_json(msg=f"cannot write {path}: {why}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
