#!/usr/bin/python
# Read-only check of one Proxmox LXC container through the Proxmox API, run on the controller
# before anything of a deploy changes: it exists for this token, it runs (started when asked),
# what it runs with passes the GPUs through and has the mount points, and whether a snapshot
# is possible. Snapshots themselves are dflash_proxmox_snapshot's. The check itself is
# module_utils/dflash_proxmox_check.py, shared with dflash_proxmox_containers.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_proxmox
short_description: Check a Proxmox LXC container before a deploy (and start it when asked)
description:
  - Runs on the controller (C(delegate_to) V(localhost)), once per container, and talks to the
    Proxmox API over HTTPS with an API token (proxmoxer).
  - Reads the config the running container has (C(current=1)) and, separately, its pending
    changes (set while it runs, applied at its next start); a GPU or mount point that is only
    pending is named as such. Pending changes are also returned and shown as a warning.
  - Checks that the container is visible to the token on the node, that it runs (starting it
    when O(start_if_stopped) is true, with a bounded wait; a start task that ends with
    C(WARNINGS) counts as started), that its config passes the GPUs through (C(devN) entries,
    or C(lxc.mount.entry) lines with a C(lxc.cgroup2.devices.allow) rule for the device
    number read from the node's /proc/devices, O(proc_devices); C(lxc.cgroup.*) rules are
    named as ignored, as Proxmox VE 8 runs cgroup v2), and that the expected mount points exist.
  - Says whether Proxmox would take a snapshot of it and, when not, why (a bind or device
    mount point, a storage without snapshots) and the fix; with O(snapshot) set that is an
    error, as is a snapshot name longer than Proxmox's 40 characters or a token that may not
    take snapshots.
  - A container locked by another operation (C(lock) in its status; a backup, a snapshot, a
    migration) is refused, naming the lock, what holds it and how to release it when nothing
    does any more (C(pct unlock)). A VMID that is not on O(node) but on another node of the
    cluster (C(/cluster/resources)) is named as migrated, with the node it is on now.
  - An HA-managed container's start only queues a request (a C(hastart) task ends before the
    container runs); the module then waits, bounded by O(start_timeout), until it runs, and
    fails early with the HA stack's own start error if that start fails.
  - All problems are reported together, before anything is changed.
  - Reports C(changed) only when it started the container. In check mode it says it would.
attributes:
  check_mode:
    support: full
    details: Reads only; a start that would happen is reported as changed.
  diff_mode:
    support: none
extends_documentation_fragment:
  - dflash_attributes
  - dflash_proxmox_api
  - dflash_proxmox_api.container
options:
  start_if_stopped:
    description:
      - Start the container when it is stopped, then wait (bounded by O(start_timeout)) for
        the start task. When false, a stopped container is an error that names the fix.
    type: bool
    default: false
  start_timeout:
    description: Seconds to wait for the start task.
    type: int
    default: 60
  gpus:
    description:
      - Indexes K of the GPUs (C(/dev/nvidiaK)) the container must have. With any GPU, the
        config must also pass C(/dev/nvidiactl) and C(/dev/nvidia-uvm) through.
    type: list
    elements: int
    default: []
  proc_devices:
    description:
      - The node kernel's /proc/devices (a container reads the node's), for the device numbers
        the cgroup2 rules of C(lxc.mount.entry)-passed GPUs must allow. Without it those
        rules are not checked.
    type: str
  mounts:
    description: Mount points the container must have (an C(mpN) with C(mp=) that path).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Path inside the container, for example C(/mnt/wheelhouse).
        type: str
        required: true
      source:
        description: When set, the node-side source the mount point must use.
        type: str
  snapshot:
    description:
      - The snapshot the deploy will take (dflash_proxmox_snapshot), checked here. Omit for none.
    type: dict
    suboptions:
      name_prefix:
        description:
          - Snapshot names are C(<name_prefix>-<UTC YYYYmmddHHMMSS>), at most 40 characters
            in all (Proxmox's limit), so the prefix has at most 25.
        type: str
        default: dflash-predeploy
      retain:
        description: How many of these snapshots to keep, the new one included (at least 1).
        type: int
        default: 3
      description:
        description: Description stored with the snapshot.
        type: str
        default: taken by dflash-deploy before a deploy
author: dflash-deploy
"""

EXAMPLES = r"""
- name: The container is ready for a deploy (token secret from PROXMOX_TOKEN_SECRET)
  dflash_proxmox:
    api_host: pve1.example.org
    api_user: dflash@pve
    api_token_id: deploy
    node: pve1
    vmid: "{{ proxmox_vmid }}"
    start_if_stopped: true
    gpus: [0, 1]
    mounts:
      - path: /mnt/wheelhouse
  environment:
    REQUESTS_CA_BUNDLE: /etc/dflash/pve-root-ca.pem
  delegate_to: localhost
"""

RETURN = r"""
vmid:
  description: The container's VMID.
  type: int
  returned: always
node:
  description: The node name.
  type: str
  returned: always
status:
  description: Container status after the module ran (C(running), C(stopped)); in check mode,
    what it is now.
  type: str
  returned: success
started:
  description: Whether the module started the container (or would, in check mode).
  type: bool
  returned: success
config:
  description: >-
    Summary of the config the container runs with (current=1): C(hostname), C(arch),
    C(memory), C(cores), C(unprivileged), C(rootfs), C(gpus) (index -> config line),
    C(devices), C(mounts) (container path -> key, source, read_only).
  type: dict
  returned: success
pending:
  description: Pending changes (C(key), C(value) now, C(pending) value, C(delete) when it goes).
  type: list
  elements: dict
  returned: success
snapshot:
  description: C(possible) (whether Proxmox would take a snapshot) and C(reason) when not.
  type: dict
  returned: success
actions:
  description: What the module did (or would do, in check mode), one line each.
  type: list
  elements: str
  returned: success
"""

import importlib.util
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import (
    PROXMOXER_ERROR,
    ProxmoxError,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import (
    connect as api_connect,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox_check import (
    container_argument_spec,
    finish_start,
    pending_warning,
    ready,
    request_start,
    validate,
)


def run(module: AnsibleModule, result: dict[str, Any]) -> None:
    params = module.params
    api = api_connect(params)
    ready(api, params, result, listed={})
    warning = pending_warning(params, result)
    if warning:
        module.warn(warning)
    if result["status"] != "running":
        result["started"] = True
        if module.check_mode:
            result["actions"].append(f"would start container {params['vmid']} (it is stopped)")
        else:
            finish_start(api, params, request_start(api, params), result)


def main() -> None:
    module = AnsibleModule(argument_spec=container_argument_spec(), supports_check_mode=True)
    result: dict[str, Any] = {
        "vmid": module.params["vmid"],
        "node": module.params["node"],
        "started": False,
        "actions": [],
    }
    try:
        validate(module.params)  # the user's to fix, whatever is installed
    except ProxmoxError as exc:
        module.fail_json(msg=str(exc), changed=False, **result)
    if PROXMOXER_ERROR is not None:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_ERROR)
    if importlib.util.find_spec("requests") is None:
        module.fail_json(msg=missing_required_lib("requests", reason="the Proxmox API (HTTPS)"))
    try:
        run(module, result)
    except ProxmoxError as exc:
        module.fail_json(msg=str(exc), changed=False, **result)
    result["changed"] = result["started"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
