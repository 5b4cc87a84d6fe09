"""The container operations behind the doubles (pct, pvesh, the HTTPS API), with Proxmox's rules
and error texts. Each names the Proxmox code it follows.

Operations that Proxmox runs as a task return a `Task`: its synchronous checks have passed (they
raise PveError, the API's immediate error) and `run(task, log)` does the work that a worker does
(raising there ends the task with `TASK ERROR: <message>`).

Snapshots (snapshots.py) are metadata only: a `[name]` section in the config (and `parent:`
links), no copy of the file system; rollback of a file system is not emulated.
"""

from __future__ import annotations

import re
import time

from . import ha, lxcctl
from .errors import PveError as PveError  # the doubles import it from here
from .errors import Task as Task
from .nodecfg import NodeConfig
from .pveconf import ConfigMissing, ConfigStore, CtConfig, parse_property_string
from .snapshots import Snapshots
from .storage import parse_storage_cfg, snapshot_capable
from .tasks import TaskLog

# pve-container src/PVE/LXC/Config.pm `$LXC_FASTPLUG_OPTIONS`, plus what
# `vmconfig_hotplug_pending` changes on a running container (limits and network; the bed
# enforces the memory limit, not cores or the network; a new mpN: see `set_config`).
# Everything else set on a running container waits in [pve:pending].
HOTPLUG = {"description", "onboot", "startup", "protection", "hostname", "hookscript", "cores",
           "tags", "lock", "memory", "swap", "cpulimit", "cpuunits"}  # fmt: skip


DEVN = re.compile(r"dev\d+")
MPN = re.compile(r"mp\d+")


def check_device(key: str, value: str) -> None:
    """LXC/Tools.pm `get_device_mode_and_rdev` (pve-container 5.0.10+) on a devN's path: `Device
    /dev/X does not exist` (a plain die: HTTP 500, `pct set` exit 255)."""
    path = parse_property_string(value, "path").get("path")
    if not path:
        raise PveError(f"Path is not defined for passthrough device {key}")
    try:
        lxcctl.device_number(path)
    except lxcctl.LxcError as exc:
        raise PveError(str(exc)) from None


class Node(Snapshots):
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.store = ConfigStore(cfg.etc_pve, cfg.node)

    @property
    def storages(self) -> dict[str, dict[str, str]]:
        path = self.cfg.etc_pve / "storage.cfg"
        return parse_storage_cfg(path.read_text() if path.exists() else "")

    # --- lookups ---------------------------------------------------------------------------
    def load(self, vmid: int) -> CtConfig:
        """AbstractConfig.pm `load_config`: a VMID without a config here dies."""
        try:
            return self.store.load(vmid)
        except ConfigMissing as exc:
            raise PveError(str(exc), exit_code=2) from None

    def status(self, vmid: int) -> dict[str, object]:
        """src/PVE/LXC.pm `vmstatus`, the fields the bed knows."""
        conf = self.load(vmid).current
        state, pid = self.lxc_state(vmid)
        data: dict[str, object] = {
            "vmid": vmid,
            "name": conf.options.get("hostname", f"CT{vmid}"),
            "status": state,
            "type": "lxc",
            "maxmem": int(conf.options.get("memory", "512")) * 1024 * 1024,
            "maxswap": int(conf.options.get("swap", "512")) * 1024 * 1024,
            "cpus": int(conf.options.get("cores", "1")),
            "uptime": self._uptime(vmid) if state == "running" else 0,
            "template": 0,
            "ha": ha.status(self.cfg, vmid),
        }
        if pid:
            data["pid"] = pid
        for key in ("lock", "tags"):
            if key in conf.options:
                data[key] = conf.options[key]
        return data

    def _uptime(self, vmid: int) -> int:
        marker = self.cfg.lxcpath / str(vmid) / "config"
        try:
            return max(0, int(time.time() - marker.stat().st_mtime))
        except OSError:
            return 0

    def list(self) -> list[dict[str, object]]:
        return [self.status(vmid) for vmid in self.store.vmids()]

    def cluster_nodes(self) -> list[str]:
        """The cluster's members: each has its folder under /etc/pve/nodes (pmxcfs)."""
        return sorted(p.name for p in (self.cfg.etc_pve / "nodes").iterdir() if p.is_dir())

    def peer(self, name: str) -> PeerNode | None:
        """Another member of the cluster, as a call proxied to it would see it."""
        if name == self.cfg.node or name not in self.cluster_nodes():
            return None
        cfg = self.cfg
        return PeerNode(NodeConfig(name, cfg.root, cfg.base_rootfs, cfg.shifted_rootfs,
                                   cfg.api_port))  # fmt: skip

    def elsewhere(self) -> list[dict[str, object]]:
        """Containers whose config is under another node's folder (one migrated there), as
        /cluster/resources lists them."""
        peers = [self.peer(name) for name in self.cluster_nodes()]
        return [{**c, "node": p.cfg.node} for p in peers if p is not None for c in p.list()]

    def migrate(self, vmid: int, target: str) -> None:
        """LXC/Migrate.pm, a restart migration as the bed can do it: the container stopped
        here (`phase1`) and its config moved into the target node's folder (`phase3`:
        `rename($conffile, $newconffile)`), which makes the target its owner."""
        if target == self.cfg.node:
            raise PveError("target is local node.")
        self.load(vmid)
        if self.running(vmid):
            lxcctl.stop(self.cfg, vmid, None)
        folder = self.cfg.etc_pve / "nodes" / target / "lxc"
        folder.mkdir(parents=True, exist_ok=True)
        self.store.path(vmid).rename(folder / f"{vmid}.conf")

    def running(self, vmid: int) -> bool:
        return self.lxc_state(vmid)[0] == "running"

    def lxc_state(self, vmid: int) -> tuple[str, int | None]:
        """What LXC says of the container here: its state and its init's pid."""
        return lxcctl.info(self.cfg, vmid)

    # --- config ----------------------------------------------------------------------------
    def config(self, vmid: int, snapshot: str | None = None, current: bool = False
               ) -> dict[str, object]:  # fmt: skip
        """API2/LXC/Config.pm `vm_config`: pending values merged in unless `current`."""
        if snapshot and current:
            message = "cannot use 'snapshot' parameter with 'current'"
            raise PveError("400 Parameter verification failed.", code=400,
                           errors={"snapshot": message, "current": message})  # fmt: skip
        conf = self.load(vmid)
        if snapshot is None:
            section = conf.current if current else conf.with_pending()
        elif snapshot in conf.snapshots:
            section = conf.snapshots[snapshot]
        else:
            raise PveError(f"snapshot '{snapshot}' does not exist")
        data = section.to_api()
        data["digest"] = self.store.digest_of(vmid)
        return data

    def pending(self, vmid: int) -> list[dict[str, object]]:
        """API2/LXC.pm `vm_pending`."""
        return self.load(vmid).pending_array()

    def set_config(self, vmid: int, values: dict[str, str], delete: list[str]) -> None:
        """API2/LXC/Config.pm `update_vm` -> LXC/Config.pm `update_pct_config` (pve-container
        5.x): changes go to [pve:pending]; a stopped container takes them at once
        (`vmconfig_apply_pending`), a running one what can be hotplugged
        (`vmconfig_hotplug_pending`): the fast-plug options, limits, network, and a new `mpN`
        (`apply_pending_mountpoint` -> LXC.pm `mountpoint_hotplug`); one that replaces an mpN
        the container has, a removed mpN and everything else wait for the next start. A
        hotplug that fails is `unable to hotplug mpN: ...`, and `update_vm` then writes nothing
        (`raise_param_exc($errors)`, HTTP 400). A devN whose device the node lacks is refused
        before anything is written (since 5.0.10, commit 556ddd3: `update_pct_config` calls
        LXC/Tools.pm `get_device_mode_and_rdev`); after the write, `update_vm` runs LXC.pm
        `update_lxc_config`, which dies on a current devN without its device (the config file
        is written by then)."""
        for key in [*values, *delete]:
            if key.startswith("lxc"):
                raise PveError.param(
                    key,
                    "property is not defined in schema and the schema does not allow "
                    "additional properties",
                )
        with self.store.locked(vmid):
            conf = self.load(vmid)
            live = self.running(vmid)
            for key in sorted(values):  # update_pct_config: `sort keys %$param`
                if DEVN.fullmatch(key):
                    check_device(key, values[key])
            errors: dict[str, str] = {}
            for key, value in values.items():
                if MPN.fullmatch(key) and live and key not in conf.current.options:
                    try:
                        lxcctl.hotplug_mount(self.cfg, vmid, key, value, conf.current)
                    except lxcctl.LxcError as exc:
                        errors[key] = f"unable to hotplug {key}: {exc}\n"
                        conf.pending.options[key] = value
                        continue
                    conf.current.options[key] = value
                    conf.pending.options.pop(key, None)
                elif live and key not in HOTPLUG and not key.startswith("net"):
                    conf.pending.options[key] = value
                else:
                    conf.current.options[key] = value
                    conf.pending.options.pop(key, None)
            if errors:  # update_vm: "don't write to config if we get any errors"
                lines = "".join(f"\n{key}: {text.rstrip()}" for key, text in sorted(errors.items()))
                raise PveError(f"400 Parameter verification failed.{lines}", code=400,
                               errors=errors)  # fmt: skip
            pending_delete = conf.pending_delete()
            for key in delete:
                if live and key not in HOTPLUG and not key.startswith("net"):
                    pending_delete.append(key)
                else:
                    conf.current.options.pop(key, None)
            if pending_delete:
                conf.pending.options["delete"] = ",".join(dict.fromkeys(pending_delete))
            self.store.write(vmid, conf)
            if live and {"memory", "swap"} & set(values):  # LXC.pm `vmconfig_hotplug_pending`
                lxcctl.change_memory_limit(self.cfg, vmid, conf.current.options)
            for key in sorted(conf.current.options):  # LXC.pm `update_lxc_config`
                if DEVN.fullmatch(key):
                    check_device(key, conf.current.options[key])

    def apply_pending(self, vmid: int) -> None:
        """LXC/Config.pm `vmconfig_apply_pending`, which `vm_start` runs first."""
        with self.store.locked(vmid):
            conf = self.load(vmid)
            if not conf.pending.options:
                return
            for key in conf.pending_delete():
                conf.current.options.pop(key, None)
            conf.pending.options.pop("delete", None)
            conf.current.options.update(conf.pending.options)
            conf.pending.options.clear()
            self.store.write(vmid, conf)

    def feature(self, vmid: int, feature: str, snapname: str | None = None
                ) -> dict[str, object]:  # fmt: skip
        """API2/LXC.pm `vm_feature` -> LXC/Config.pm `has_feature` (snapshot only)."""
        if feature not in ("snapshot", "clone", "copy"):
            raise PveError.param("feature", f"value '{feature}' does not have a value in the "
                                 "enumeration 'snapshot, clone, copy'")  # fmt: skip
        conf = self.load(vmid)
        section = conf.current
        if snapname:
            if snapname not in conf.snapshots:
                raise PveError(f"snapshot '{snapname}' does not exist")
            section = conf.snapshots[snapname]
        volumes = self.volumes(section.options)
        capable = feature == "snapshot" and all(
            snapshot_capable(self.storages, volume) for volume in volumes.values()
        )
        return {"hasFeature": 1 if capable else 0}

    @staticmethod
    def volumes(options: dict[str, str]) -> dict[str, str]:
        """LXC/Config.pm `foreach_volume`: rootfs and every mpN -> its volume (or path)."""
        found = {}
        for key in sorted(options):
            if key == "rootfs" or re.fullmatch(r"mp\d+", key):
                found[key] = parse_property_string(options[key], "volume")["volume"]
        return found

    # --- tasks: power ----------------------------------------------------------------------
    def start(self, vmid: int) -> Task:
        """API2/LXC/Status.pm `vm_start`: an HA-managed container gets a `hastart` task (ha.py)."""
        self.load(vmid)
        if self.running(vmid):
            raise PveError(f"CT {vmid} already running")
        if ha.status(self.cfg, vmid)["managed"]:
            return Task("hastart", str(vmid), "do_hastart", (vmid,))
        return Task("vzstart", str(vmid), "do_start", (vmid,))

    def do_hastart(self, log: TaskLog, vmid: int) -> None:
        """vm_start's `$hacmd`: the request is queued and the task ends OK; the LRM starts the
        container later (ha.py)."""
        log.print(f"Requesting HA start for CT {vmid}")
        ha.set_state(self.cfg, vmid, "started")
        ha.set_service_state(self.cfg, vmid, "request_start")
        ha.request_start(self.cfg, vmid)

    def do_start(self, log: TaskLog, vmid: int) -> None:
        """vm_start's `$realcmd`: AbstractConfig.pm `check_lock` (a `mounted` lock excepted),
        then LXC.pm `vm_start`, which applies the pending changes first."""
        lock = self.load(vmid).current.options.get("lock")
        if lock and lock != "mounted":
            raise PveError(f"CT is locked ({lock})")
        self.apply_pending(vmid)
        lxcctl.start(self.cfg, vmid, self.store, log)

    def unlock(self, vmid: int) -> None:
        """CLI/pct.pm `unlock`: the `lock` property removed, under the config lock."""
        with self.store.locked(vmid):
            conf = self.load(vmid)
            conf.current.options.pop("lock", None)
            self.store.write(vmid, conf)

    def stop(self, vmid: int, timeout_s: int | None = None) -> Task:
        """API2/LXC/Status.pm `vm_stop` / `vm_shutdown`."""
        self.load(vmid)
        if not self.running(vmid):
            raise PveError(f"CT {vmid} not running")
        kind = "vzstop" if timeout_s is None else "vzshutdown"
        return Task(kind, str(vmid), "do_stop", (vmid, timeout_s))

    def do_stop(self, log: TaskLog, vmid: int, timeout_s: int | None) -> None:
        lxcctl.stop(self.cfg, vmid, timeout_s)

    def run(self, task: Task, log: TaskLog) -> None:
        getattr(self, task.op)(log, *task.args)


class PeerNode(Node):
    """Another node of the cluster: the configs in its folder (containers migrated there) are
    its own. The bed runs no second node, so each of them is shown as running, as after an
    online or restart migration; API2 answers its reads as the node would once pveproxy has
    proxied the call there (AnyEvent.pm `proxy_request`)."""

    def lxc_state(self, vmid: int) -> tuple[str, int | None]:
        self.load(vmid)
        return "running", None
