#!/usr/bin/python
# Makes an unpacked release current, atomically.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_activate
short_description: Switch C(current) to a release atomically
description:
  - Points C(current) at C(releases/<release>) through a temp link and a rename, so C(current)
    is never missing nor dangling. When the release is already current nothing changes.
  - The deployment is recorded afterwards by M(dflash_record), once its health is known.
options:
  root:
    description: State root on the target.
    type: path
    required: true
  release:
    description: Release id to make current.
    type: str
    required: true
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Make the new release current
  dflash_activate:
    root: /opt/dflash
    release: v1.4.0
"""

RETURN = r"""
previous:
  description: Release that was current before (null on a first deploy).
  type: str
  returned: success
switched:
  description: Whether C(current) was switched.
  type: bool
  returned: success
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dflash_state import (
    StateError,
    current_release,
    deploy_lock,
    list_releases,
    read_manifest,
    release_dir,
    switch_current,
)


def run(module: AnsibleModule) -> dict:
    root, release = module.params["root"], module.params["release"]
    previous, _link = current_release(root)
    switching = previous != release
    result = {
        "changed": switching,
        "previous": previous,
        "switched": switching,
        "diff": {"before": f"current -> {previous}\n", "after": f"current -> {release}\n"},
    }
    if module.check_mode or not switching:
        # In check mode the release may not be unpacked yet: it would have been by now.
        return result
    if read_manifest(release_dir(root, release)) is None:
        raise StateError(
            f"release {release} is not unpacked under {root}/releases; deploy it first "
            f"(available: {', '.join(list_releases(root)) or 'none'})"
        )
    with deploy_lock(root):
        switch_current(root, release)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    if not os.path.isdir(module.params["root"]):
        module.fail_json(msg=f"state root {module.params['root']} does not exist; deploy first")
    try:
        module.exit_json(**run(module))
    except StateError as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
