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
  - A C(current) that is not a symlink (a folder or file copied over it by hand) is moved aside
    to C(current.replaced-<time>), kept and named in the result, then replaced by the link.
    Temp links of killed earlier runs are removed.
  - The deployment is recorded afterwards by M(dflash_launch) or M(dflash_record), once its
    health is known.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
  - dflash_deploy_lock_token.takes_the_lock
options:
  release:
    description: Release id to make current.
    type: str
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
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
moved_aside:
  description: Where a C(current) that was no symlink was moved (kept, not deleted).
  type: str
  returned: when current was not a symlink
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    disk_full_message,
    is_disk_full,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, held
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    CURRENT,
    TMP_PREFIX,
    StateError,
    current_release,
    list_releases,
    read_manifest,
    release_dir,
    switch_current,
)


def stale_links(root: str) -> list[str]:
    return sorted(
        os.path.join(root, name)
        for name in os.listdir(root)
        if name.startswith(f"{TMP_PREFIX}current-") and os.path.islink(os.path.join(root, name))
    )


def run(module: AnsibleModule) -> dict:
    root, release = module.params["root"], module.params["release"]
    path = os.path.join(root, CURRENT)
    blocked = os.path.lexists(path) and not os.path.islink(path)
    previous, _link = current_release(root)
    switching = blocked or previous != release
    before = "current is not a link (moved aside)" if blocked else f"current -> {previous}"
    result = {
        "changed": switching,
        "previous": previous,
        "switched": switching,
        "diff": {"before": f"{before}\n", "after": f"current -> {release}\n"},
    }
    if module.check_mode or not switching:
        # In check mode the release may not be unpacked yet: it would have been by now.
        return result
    if read_manifest(release_dir(root, release)) is None:
        raise StateError(
            f"release {release} is not unpacked under {root}/releases; deploy it first "
            f"(available: {', '.join(list_releases(root)) or 'none'})"
        )
    # The release is the run's intent from here: a run that takes the lock over finishes it.
    with held(root, module.params["token"], "deploy", "activate", release=release):
        for link in stale_links(root):
            os.unlink(link)
        if blocked:
            # Whatever a hand put there is kept, under a name that says what it was.
            aside = f"{path}.replaced-{time.strftime('%Y%m%dT%H%M%S')}"
            os.rename(path, aside)
            result["moved_aside"] = aside
            module.warn(
                f"{path} was a {'folder' if os.path.isdir(aside) else 'file'}, not the link to a "
                f"release; it was moved to {aside} (kept) and replaced by the link"
            )
        switch_current(root, release)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            release={"type": "str", "required": True},
        ),
        supports_check_mode=True,
    )
    if not os.path.isdir(module.params["root"]):
        module.fail_json(msg=f"state root {module.params['root']} does not exist; deploy first")
    try:
        module.exit_json(**run(module))
    except (StateError, LockError) as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        if not is_disk_full(err):
            raise
        module.fail_json(msg=disk_full_message(module.params["root"], err))


if __name__ == "__main__":
    main()
