#!/usr/bin/python
# Read-only check of one Proxmox LXC container through the Proxmox API, run on the controller
# before anything of a deploy changes: it exists for this token, it runs (started when asked),
# what it runs with passes the GPUs through and has the mount points, and whether a snapshot
# is possible. Snapshots themselves are dflash_proxmox_snapshot's. Over 300 lines because ~140
# are its DOCUMENTATION and RETURN; the code is ~250.
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
    description: Reads only; a start that would happen is reported as changed.
extends_documentation_fragment:
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
import re
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.dflash_proxmox import (
    PROXMOXER_ERROR,
    ProxmoxError,
    auth_argument_spec,
    call,
    token_name,
    wait_task,
)
from ansible.module_utils.dflash_proxmox import connect as api_connect
from ansible.module_utils.dflash_proxmox_cluster import (
    lock_problem,
    migrated_problem,
    wait_running,
    where_is,
)
from ansible.module_utils.dflash_proxmox_config import (
    char_majors,
    gpu_problems,
    mount_problems,
    snapshot_blockers,
    summarize,
)

SNAP_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
SNAP_NAME_MAX = 40  # pve-common JSONSchema.pm `pve-snapshot-name`: maxLength 40
STAMP_LEN = len("-YYYYmmddHHMMSS")


def validate(params: dict[str, Any]) -> None:
    """Input errors, found before any call: nothing is changed when one is found."""
    vmid, spec = params["vmid"], params["snapshot"]
    if spec is not None:
        prefix = spec["name_prefix"]
        example = f"{prefix}-20260101120000"
        if not SNAP_PREFIX.match(prefix):
            raise ProxmoxError(
                f"dflash_proxmox_snapshot.name_prefix {prefix!r} (container {vmid}) is not "
                "usable in a Proxmox snapshot name: letters, digits, '-' and '_', starting with "
                "a letter; nothing was changed"
            )
        if len(example) > SNAP_NAME_MAX:
            raise ProxmoxError(
                f"the snapshot names of container {vmid} would be {len(example)} characters "
                f"('{example}'), and Proxmox allows at most {SNAP_NAME_MAX}: shorten "
                f"dflash_proxmox_snapshot.name_prefix to at most {SNAP_NAME_MAX - STAMP_LEN} "
                "characters; nothing was changed"
            )
        if spec["retain"] < 1:
            raise ProxmoxError(
                f"dflash_proxmox_snapshot.retain is {spec['retain']} (container {vmid}): it "
                "must be at least 1, or the snapshot just taken would be deleted at once (use "
                "dflash_proxmox_snapshot: {} for none); nothing was changed"
            )
    for gpu in params["gpus"]:
        if gpu < 0:
            raise ProxmoxError(f"gpus: {gpu} is not a GPU index (0, 1, ...)")
    if params["start_timeout"] < 1 or params["api_timeout"] < 1:
        raise ProxmoxError("start_timeout and api_timeout must be at least 1 second")


def find_container(api: Any, params: dict[str, Any]) -> None:
    """The container must be in the token's list of the node's containers: with privilege
    separation a token sees only those its own ACL lets it audit (API2/LXC.pm `vmlist`)."""
    node, vmid, token = params["node"], params["vmid"], token_name(params)
    try:
        containers = api.nodes(node).lxc.get()
    except Exception as exc:
        known = [n.get("node") for n in call("listing the nodes", api.nodes.get, token=token)]
        if node not in known:
            raise ProxmoxError(
                f"node {node!r} is not known to the Proxmox API (nodes: "
                f"{', '.join(map(str, known)) or 'none'}); set proxmox_node to the one that "
                f"holds container {vmid}"
            ) from exc
        raise ProxmoxError(f"listing the containers of node {node} failed: {exc}") from exc
    seen = sorted(int(c["vmid"]) for c in containers)
    if vmid not in seen:
        now_on = where_is(api, vmid, token)
        if now_on and now_on != node:
            raise ProxmoxError(migrated_problem(vmid, node, now_on))
        raise ProxmoxError(
            f"container {vmid} is not among the containers that token {token} sees on node "
            f"{node} ({', '.join(map(str, seen)) or 'none'}): it does not exist there, or the "
            f"token lacks VM.Audit on /vms/{vmid}; check proxmox_vmid and proxmox_node, or "
            f"grant it: pveum acl modify /vms/{vmid} --tokens '{token}' --roles PVEVMAdmin"
        )


def privileges(api: Any, params: dict[str, Any]) -> set[str]:
    """The token's own privileges on the container (GET /access/permissions?path=...)."""
    path = f"/vms/{params['vmid']}"
    found = call(
        f"reading the privileges of token {token_name(params)}",
        api.access.permissions.get,
        path=path,
        token=token_name(params),
    )
    return set((found or {}).get(path, {}))


def check(api: Any, params: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """Read what the container has; return every problem (nothing changed yet)."""
    node, vmid, token = params["node"], params["vmid"], token_name(params)
    ct = api.nodes(node).lxc(vmid)
    config = call(f"reading the config of container {vmid}", ct.config.get, current=1, token=token)
    current = call(f"reading the status of container {vmid}", ct.status.current.get, token=token)
    status = current["status"]
    pending = call(f"reading the pending changes of container {vmid}", ct.pending.get, token=token)
    changes = [item for item in pending if "pending" in item or item.get("delete")]
    later = {item["key"]: item["pending"] for item in changes if "pending" in item}
    feature = call(
        f"checking the snapshot feature of container {vmid}",
        ct.feature.get,
        feature="snapshot",
        token=token,
    )
    possible = bool(int(feature.get("hasFeature") or 0))
    result.update(
        status=status,
        config=summarize(config, params["gpus"]),
        pending=changes,
        snapshot={
            "possible": possible,
            "reason": None if possible else snapshot_blockers(config, vmid),
        },
    )
    majors = char_majors(params["proc_devices"]) if params["proc_devices"] is not None else None
    problems = gpu_problems(config, later, vmid, params["gpus"], majors)
    problems += mount_problems(config, later, vmid, params["mounts"])
    locked = lock_problem(vmid, node, current.get("lock"))
    if locked:
        problems.append(locked)
    needed = []
    if params["snapshot"] is not None:
        if not possible:
            problems.append(
                f"container {vmid} cannot be snapshotted: {result['snapshot']['reason']}"
            )
        needed.append(("VM.Snapshot", "take snapshots of", "PVEVMAdmin"))
    if status != "running" and not params["start_if_stopped"]:
        problems.append(
            f"container {vmid} on node {node} is {status}; start it (pct start {vmid}) or set "
            "dflash_proxmox_start_if_stopped: true"
        )
    elif status != "running":
        needed.append(("VM.PowerMgmt", "start", "PVEVMUser"))
    have = privileges(api, params) if needed else set()
    for priv, verb, role in needed:
        if priv not in have:
            problems.append(
                f"token {token} may not {verb} container {vmid} (no {priv} on /vms/{vmid}); "
                f"grant it: pveum acl modify /vms/{vmid} --tokens '{token}' --roles {role}"
            )
    return problems


def start(api: Any, params: dict[str, Any], result: dict[str, Any]) -> None:
    node, vmid, token = params["node"], params["vmid"], token_name(params)
    what = f"starting container {vmid} on node {node}"
    upid = call(what, api.nodes(node).lxc(vmid).status.start.post, token=token)
    try:
        ended = wait_task(api, node, str(upid), params["start_timeout"], what, token)
    except ProxmoxError as exc:
        device = re.search(r"Device (/dev/\S+) does not exist", str(exc))
        if device:
            raise ProxmoxError(
                f"{exc}: node {node} has no {device[1]}, and Proxmox starts no container whose "
                f"devN names a device the node lacks; load its driver on the node, or remove "
                f"the entry (pct set {vmid} -delete devN)"
            ) from exc
        raise
    note = "" if ended == "OK" else f"; its task ended with {ended}"
    if ":hastart:" in str(upid):  # HA-managed: the task only queued the request
        waited = wait_running(api, node, vmid, params["start_timeout"], token)
        note += f"; HA-managed: the HA stack started it {waited:.0f} s after the request"
    result["status"] = "running"
    result["actions"].append(f"started container {vmid} (it was stopped{note})")


def run(module: AnsibleModule, result: dict[str, Any]) -> None:
    params = module.params
    api = api_connect(params)
    find_container(api, params)
    problems = check(api, params, result)
    if problems:
        count = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
        raise ProxmoxError(
            f"container {params['vmid']} on node {params['node']} is not ready ({count}): "
            + "; ".join(problems)
        )
    if result["pending"]:
        keys = ", ".join(f"{c['key']}: {c.get('pending', '(delete)')}" for c in result["pending"])
        module.warn(
            f"container {params['vmid']} has pending changes, applied only at its next "
            f"start: {keys}"
        )
    if result["status"] != "running":
        result["started"] = True
        if module.check_mode:
            result["actions"].append(f"would start container {params['vmid']} (it is stopped)")
        else:
            start(api, params, result)


def main() -> None:
    spec = auth_argument_spec()
    spec.update(
        node={"type": "str", "required": True},
        vmid={"type": "int", "required": True},
        start_if_stopped={"type": "bool", "default": False},
        start_timeout={"type": "int", "default": 60},
        gpus={"type": "list", "elements": "int", "default": []},
        proc_devices={"type": "str"},
        mounts={
            "type": "list",
            "elements": "dict",
            "default": [],
            "options": {"path": {"type": "str", "required": True}, "source": {"type": "str"}},
        },
        snapshot={
            "type": "dict",
            "options": {
                "name_prefix": {"type": "str", "default": "dflash-predeploy"},
                "retain": {"type": "int", "default": 3},
                "description": {"type": "str", "default": "taken by dflash-deploy before a deploy"},
            },
        },
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
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
