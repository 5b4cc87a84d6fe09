#!/usr/bin/python
# A snapshot of one Proxmox LXC container before a deploy changes it, with retention that only
# ever deletes this module's own snapshots (community.proxmox.proxmox_snap's retention counts
# every snapshot of the container, the user's included).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_proxmox_snapshot
short_description: Snapshot a Proxmox LXC container before a deploy, keeping the newest N of ours
description:
  - Runs on the controller (C(delegate_to) V(localhost)) and talks to the Proxmox API over
    HTTPS with an API token (proxmoxer), like M(dflash_proxmox), whose check should run first
    (it says whether a snapshot is possible at all).
  - Takes the snapshot C(<name_prefix>-<UTC YYYYmmddHHMMSS>) and waits (bounded) for its task;
    then deletes the oldest snapshots named C(<name_prefix>-<14 digits>) beyond O(retain).
    Snapshots of other names are never touched.
  - A task that ends with C(WARNINGS) counts as done; one that fails is an error with the tail
    of its log.
  - Proxmox freezes a running container while it snapshots its volumes. The module says so,
    with the seconds the snapshot took (the pause is part of them).
attributes:
  check_mode:
    support: full
    details: Reports the snapshot it would take and the ones it would delete, as changed.
  diff_mode:
    support: none
extends_documentation_fragment:
  - dflash_attributes
  - dflash_proxmox_api
  - dflash_proxmox_api.container
options:
  name_prefix:
    description: Prefix of this module's snapshot names (at most 25 characters).
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
  task_timeout:
    description: Seconds to wait for each snapshot task (taking one, deleting one).
    type: int
    default: 120
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Snapshot the container before the deploy changes it, keeping three of ours
  dflash_proxmox_snapshot:
    api_host: pve1.example.org
    api_user: dflash@pve
    api_token_id: deploy
    node: pve1
    vmid: "{{ proxmox_vmid }}"
    retain: 3
  delegate_to: localhost
"""

RETURN = r"""
snapshot:
  description: C(created) (name), C(removed) (names) and C(kept) (this module's snapshots left
    after retention), C(seconds) (how long taking it lasted) and C(froze_running) (whether
    the container ran, so Proxmox froze it meanwhile). In check mode, what would be created
    and removed.
  type: dict
  returned: always
actions:
  description: What the module did (or would do, in check mode), one line each.
  type: list
  elements: str
  returned: always
"""

import itertools
import re
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import (
    PROXMOXER_ERROR,
    ProxmoxError,
    auth_argument_spec,
    call,
    connect,
    token_name,
    wait_task,
)

SNAP_STAMP = "%Y%m%d%H%M%S"


def plan(
    snapshots: list[dict[str, Any]], prefix: str, retain: int, now: float
) -> tuple[str, list[str], list[str]]:
    """(name to create, names to delete after it, names kept) among this module's snapshots."""
    ours_re = re.compile(rf"^{re.escape(prefix)}-\d{{14}}(?:-\d+)?$")
    ours = sorted(
        (s for s in snapshots if s.get("name") != "current" and ours_re.match(str(s["name"]))),
        key=lambda s: (int(s.get("snaptime") or 0), str(s["name"])),
    )
    taken = {str(s["name"]) for s in snapshots}
    # Two deploys within one second: the next free second, not a `-2` suffix, so the name
    # stays as long as the one validate() checked against Proxmox's 40 characters.
    name = next(
        candidate
        for offset in itertools.count()
        if (candidate := f"{prefix}-{time.strftime(SNAP_STAMP, time.gmtime(now + offset))}")
        not in taken
    )
    order = [str(s["name"]) for s in ours] + [name]
    remove = order[: max(0, len(order) - retain)]
    return name, remove, [n for n in order if n not in remove]


def snapshot(module: AnsibleModule, result: dict[str, Any]) -> None:
    """Snapshot, then retention; `result` records each step as it completes."""
    params = module.params
    node, vmid, token = params["node"], params["vmid"], token_name(params)
    api = connect(params)
    ct = api.nodes(node).lxc(vmid)
    existing = call(f"listing the snapshots of container {vmid}", ct.snapshot.get, token=token)
    name, remove, kept = plan(existing, params["name_prefix"], params["retain"], time.time())
    done = result["snapshot"]
    done["kept"] = kept
    if module.check_mode:
        done.update(created=name, removed=remove)
        result["actions"] += [f"would take snapshot {name}"]
        result["actions"] += [f"would delete snapshot {old} (retention)" for old in remove]
        return
    what = f"snapshot {name} of container {vmid}"
    began = time.monotonic()
    upid = call(
        what, ct.snapshot.post, snapname=name, description=params["description"], token=token
    )
    wait_task(api, node, str(upid), params["task_timeout"], what, token)
    took = round(time.monotonic() - began, 1)
    # Proxmox freezes a running container while its volumes are snapshotted (LXC/Config.pm
    # `__snapshot_freeze`): the trainer stands still for part of that time.
    running = any(s.get("name") == "current" and s.get("running") for s in existing)
    done.update(created=name, seconds=took, froze_running=running)
    paused = (
        f"; the container ran: Proxmox froze its processes, the trainer's among them, for "
        f"part of those {took:g} s (verify's throughput windows take a median step, which "
        "one paused step does not move)"
        if running
        else ""
    )
    result["actions"].append(f"took snapshot {name} in {took:g} s{paused}")
    for old in remove:
        what = f"deleting snapshot {old} of container {vmid}"
        upid = call(what, ct.snapshot(old).delete, token=token)
        wait_task(api, node, str(upid), params["task_timeout"], what, token)
        done["removed"].append(old)
        result["actions"].append(f"deleted snapshot {old} (retention)")


def main() -> None:
    spec = auth_argument_spec()
    spec.update(
        node={"type": "str", "required": True},
        vmid={"type": "int", "required": True},
        name_prefix={"type": "str", "default": "dflash-predeploy"},
        retain={"type": "int", "default": 3},
        description={"type": "str", "default": "taken by dflash-deploy before a deploy"},
        task_timeout={"type": "int", "default": 120},
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    result: dict[str, Any] = {
        "snapshot": {"created": None, "removed": [], "kept": []},
        "actions": [],
    }
    if module.params["retain"] < 1:
        module.fail_json(
            msg=f"retain is {module.params['retain']}: keep at least 1 (the new "
            "snapshot); nothing was changed",
            changed=False,
            **result,
        )
    if PROXMOXER_ERROR is not None:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_ERROR)
    try:
        snapshot(module, result)
    except ProxmoxError as exc:
        # changed tells the truth on failure too: the snapshot may have been taken
        module.fail_json(msg=str(exc), changed=bool(result["actions"]), **result)
    module.exit_json(changed=bool(result["actions"]), **result)


if __name__ == "__main__":
    main()
