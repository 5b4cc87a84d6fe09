# The check of one Proxmox LXC container before a deploy, given an API handle: its input
# errors, whether the token sees it on its node (or where it went), what it runs with (GPUs,
# mount points, a lock, pending changes), whether a snapshot is possible, and its start.
# Shared by dflash_proxmox (one container) and dflash_proxmox_containers (all of a play's,
# one API session per node).
from __future__ import annotations

import re
from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import (
    ProxmoxError,
    auth_argument_spec,
    call,
    token_name,
    wait_task,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox_cluster import (
    lock_problem,
    migrated_problem,
    wait_running,
    where_is,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox_config import (
    char_majors,
    gpu_problems,
    mount_problems,
    snapshot_blockers,
    summarize,
)

SNAP_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
SNAP_NAME_MAX = 40  # pve-common JSONSchema.pm `pve-snapshot-name`: maxLength 40
STAMP_LEN = len("-YYYYmmddHHMMSS")


def container_argument_spec() -> dict[str, Any]:
    """dflash_proxmox's options: the API connection, the container and what it must have."""
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
    return spec


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


def list_node(api: Any, node: str, vmid: int, token: str, listed: dict[str, list[int]]) -> None:
    """The VMIDs the token sees on a node (asked for container `vmid`), read once into
    `listed` for all its containers.
    With privilege separation a token sees only those its own ACL lets it audit (API2/LXC.pm
    `vmlist`)."""
    if node in listed:
        return
    try:
        listed[node] = sorted(int(c["vmid"]) for c in api.nodes(node).lxc.get())
    except Exception as exc:
        known = [n.get("node") for n in call("listing the nodes", api.nodes.get, token=token)]
        if node not in known:
            raise ProxmoxError(
                f"node {node!r} is not known to the Proxmox API (nodes: "
                f"{', '.join(map(str, known)) or 'none'}); set proxmox_node to the one that "
                f"holds container {vmid}"
            ) from exc
        raise ProxmoxError(f"listing the containers of node {node} failed: {exc}") from exc


def find_container(api: Any, params: dict[str, Any], listed: dict[str, list[int]]) -> None:
    """The container must be in the token's list of the node's containers, or be named where
    it is now (migrated)."""
    node, vmid, token = params["node"], params["vmid"], token_name(params)
    list_node(api, node, vmid, token, listed)
    seen = listed[node]
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


def ready(api: Any, params: dict[str, Any], result: dict[str, Any],
          listed: dict[str, list[int]]) -> None:  # fmt: skip
    """Fill `result` with what the container has; raise with every problem at once."""
    find_container(api, params, listed)
    problems = check(api, params, result)
    if problems:
        count = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
        raise ProxmoxError(
            f"container {params['vmid']} on node {params['node']} is not ready ({count}): "
            + "; ".join(problems)
        )


def pending_warning(params: dict[str, Any], result: dict[str, Any]) -> str | None:
    if not result["pending"]:
        return None
    keys = ", ".join(f"{c['key']}: {c.get('pending', '(delete)')}" for c in result["pending"])
    vmid = params["vmid"]
    return f"container {vmid} has pending changes, applied only at its next start: {keys}"


def request_start(api: Any, params: dict[str, Any]) -> str:
    """POST the start; its task's UPID (several starts are requested before any is waited)."""
    node, vmid = params["node"], params["vmid"]
    what = f"starting container {vmid} on node {node}"
    return str(call(what, api.nodes(node).lxc(vmid).status.start.post, token=token_name(params)))


def finish_start(api: Any, params: dict[str, Any], upid: str, result: dict[str, Any]) -> None:
    """Wait, bounded, for a start requested by request_start, then until an HA-managed
    container really runs."""
    node, vmid, token = params["node"], params["vmid"], token_name(params)
    what = f"starting container {vmid} on node {node}"
    try:
        ended = wait_task(api, node, upid, params["start_timeout"], what, token)
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
    if ":hastart:" in upid:  # HA-managed: the task only queued the request
        waited = wait_running(api, node, vmid, params["start_timeout"], token)
        note += f"; HA-managed: the HA stack started it {waited:.0f} s after the request"
    result["status"] = "running"
    result["actions"].append(f"started container {vmid} (it was stopped{note})")
