# What a Proxmox VE cluster does to a container between two deploys, read through the API and
# told as a problem with its fix: a lock held by another operation, a migration to another
# node, an HA-managed start that returns before the container runs.
from __future__ import annotations

import time
from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import ProxmoxError, call

# pve-container src/PVE/LXC/Config.pm, the `lock` property's values: what holds each one.
LOCK_HOLDERS = {
    "backup": "a backup (vzdump) of it runs",
    "create": "it is being created",
    "destroyed": "it is being destroyed",
    "disk": "a disk of it is being moved or resized",
    "fstrim": "pct fstrim runs on it",
    "migrate": "it is being migrated to another node",
    "mounted": "its volumes are mounted on the node (pct mount)",
    "rollback": "it is being rolled back to a snapshot",
    "snapshot": "a snapshot of it is being taken",
    "snapshot-delete": "a snapshot of it is being deleted",
}
RUNNING_POLL_S = 1.0


def lock_problem(vmid: int, node: str, lock: str | None) -> str | None:
    """A container's `lock` as a problem that says what holds it and what to do: Proxmox
    refuses a start or a snapshot of a locked container (AbstractConfig.pm `check_lock`)."""
    if not lock:
        return None
    holder = LOCK_HOLDERS.get(lock, "another operation runs on it")
    release = "pct unmount" if lock == "mounted" else "pct unlock"
    return (
        f"container {vmid} is locked ({lock}): {holder}. Wait until that ends and run again; if "
        f"nothing holds it any more (its task died: pvesh get /nodes/{node}/tasks --vmid "
        f"{vmid} --source active lists none), release it on node {node}: {release} {vmid}"
    )


def where_is(api: Any, vmid: int, token: str) -> str | None:
    """The node a container is on, from /cluster/resources (every node's guests), or None."""
    found = call("listing the cluster's guests", api.cluster.resources.get, type="vm", token=token)
    for entry in found or []:
        if str(entry.get("vmid")) == str(vmid) and entry.get("type") == "lxc":
            return str(entry.get("node"))
    return None


def migrated_problem(vmid: int, node: str, now_on: str) -> str:
    return (
        f"container {vmid} is on node {now_on} now, not on {node} (it was migrated there): set "
        f"proxmox_node: {now_on} for its host in the inventory, and the address its pct "
        f"transport reaches (ansible_host) to node {now_on}'s, then run again (a "
        "community.proxmox dynamic inventory, inventory/dflash.example.proxmox.yml, follows a "
        "migration by itself); nothing was changed"
    )


def _failed_start(api: Any, node: str, vmid: int, since: float, token: str) -> str | None:
    """The exit status of a `vzstart` of this container that ended in an error after `since`
    (the HA stack's own start: an HA start request cannot say how it went)."""
    tasks = call(
        f"reading the tasks of node {node}",
        api.nodes(node).tasks.get,
        vmid=vmid,
        typefilter="vzstart",
        token=token,
    )
    for task in tasks or []:
        mine = task.get("type") == "vzstart" and str(task.get("id")) == str(vmid)
        ended = task.get("status") == "stopped" and int(task.get("starttime") or 0) >= since
        status = str(task.get("exitstatus") or "")
        if mine and ended and status != "OK" and not status.startswith("WARNINGS"):
            return f"{status} (task {task.get('upid')})"
    return None


def wait_running(api: Any, node: str, vmid: int, timeout: float, token: str) -> float:
    """After an HA start request (a `hastart` task ends OK once the request is queued;
    pve-container API2/LXC/Status.pm `vm_start`), wait, bounded, until the HA stack has
    started the container; return the seconds waited."""
    began, requested = time.monotonic(), int(time.time()) - 1
    status = api.nodes(node).lxc(vmid).status.current
    while True:
        now = call(f"reading the status of container {vmid}", status.get, token=token)
        if now.get("status") == "running":
            return time.monotonic() - began
        # The start's own task is root@pam's (the LRM's): a token reads it only with Sys.Audit
        # on the node; the HA state `error` says the start failed in any case.
        failed = _failed_start(api, node, vmid, requested, token)
        if failed or (now.get("ha") or {}).get("state") == "error":
            raise ProxmoxError(
                f"container {vmid} is HA-managed: its start was requested, and the HA stack's "
                f"start failed on node {node}: "
                + (
                    failed
                    or "HA state error (ha-manager status; the node's task log of the "
                    f"vzstart of CT {vmid}, which this token reads only with Sys.Audit on "
                    f"/nodes/{node})"
                )
                + f"; fix that, then run again (ha-manager set ct:{vmid} --state started "
                "clears the error state)"
            )
        if time.monotonic() - began >= timeout:
            raise ProxmoxError(
                f"container {vmid} is HA-managed: its start was requested and it was not "
                f"running {timeout:g} s later (HA state {(now.get('ha') or {}).get('state')}); "
                f"the HA stack starts it when its manager gets to it (ha-manager status on node "
                f"{node}): raise dflash_proxmox_start_timeout if the cluster is slow"
            )
        time.sleep(RUNNING_POLL_S)
