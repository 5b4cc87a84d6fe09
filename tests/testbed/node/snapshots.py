"""Snapshots of a container (part of ops.Node): metadata only, a `[name]` section in the config
with `parent:` links; a running container is frozen while its volumes are "snapshotted"."""

from __future__ import annotations

import re
import time

from . import lxcctl
from .errors import PveError, Task
from .nodecfg import fault, hold

TYPE_CHECKING = False  # not from typing: see cli.py
if TYPE_CHECKING:
    from .nodecfg import NodeConfig
    from .pveconf import ConfigStore
    from .tasks import TaskLog

# pve-common src/PVE/JSONSchema.pm: `pve-configid` ($CONFIGID_RE) and `pve-snapshot-name`.
CONFIGID = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
SNAPNAME_MAX = 40


def check_snapname(name: str) -> None:
    """JSONSchema.pm `check_prop`: the format first, then maxLength."""
    if not CONFIGID.match(name):
        raise PveError.param("snapname", f"invalid format - invalid configuration ID '{name}'\n")
    if len(name) > SNAPNAME_MAX:
        raise PveError.param("snapname", f"value may only be {SNAPNAME_MAX} characters long")


class Snapshots:
    """The snapshot operations of ops.Node, which gives them its config store (`cfg`, `store`)
    and lookups (`load`, `running`, `feature`)."""

    cfg: NodeConfig
    store: ConfigStore

    def snapshots(self, vmid: int) -> list[dict[str, object]]:
        """API2/LXC/Snapshot.pm `list`: every snapshot, then `current`."""
        conf = self.load(vmid)
        result: list[dict[str, object]] = []
        for name, section in conf.snapshots.items():
            entry: dict[str, object] = {
                "name": name,
                "description": section.description,
                "snaptime": int(section.options.get("snaptime", "0")),
            }
            if section.options.get("parent"):
                entry["parent"] = section.options["parent"]
            result.append(entry)
        current: dict[str, object] = {
            "name": "current",
            "description": "You are here!",
            "running": 1 if self.running(vmid) else 0,
        }
        if conf.current.options.get("parent"):
            current["parent"] = conf.current.options["parent"]
        result.append(current)
        return result

    def snapshot(self, vmid: int, name: str, description: str = "") -> Task:
        """API2/LXC/Snapshot.pm `snapshot`: the schema check of `snapname`, then the reserved
        names; the rest happens in the worker."""
        check_snapname(name)
        if name in ("current", "vzdump"):
            raise PveError(f"unable to use snapshot name '{name}' (reserved name)")
        self.load(vmid)
        return Task("vzsnapshot", str(vmid), "do_snapshot", (vmid, name, description))

    def do_snapshot(self, log: TaskLog, vmid: int, name: str, description: str) -> None:
        """AbstractConfig.pm `snapshot_create`: `__snapshot_prepare` (check_lock, then
        `lock: snapshot` and the new section with `snapstate: prepare` written), a running
        container frozen while its volumes are snapshotted (LXC/Config.pm `__snapshot_freeze`:
        PVE::LXC::freeze, then thaw; the volumes take `snapshot_seconds` of faults.json here),
        then `__snapshot_commit` (snapstate and lock removed, `parent` set)."""
        with self.store.locked(vmid):
            conf = self.load(vmid)
            if "lock" in conf.current.options:
                raise PveError(f"CT is locked ({conf.current.options['lock']})")
            if name in conf.snapshots:
                raise PveError(f"snapshot name '{name}' already used")
            if not self.feature(vmid, "snapshot")["hasFeature"]:
                raise PveError("snapshot feature is not available")
            snap = conf.current.copy()
            snap.options["snaptime"] = str(int(time.time()))
            snap.options["snapstate"] = "prepare"
            snap.description = description
            conf.snapshots[name] = snap
            conf.current.options["lock"] = "snapshot"
            self.store.write(vmid, conf)
        frozen = self.running(vmid)
        if frozen:
            lxcctl.freeze(self.cfg, vmid)
        try:
            hold(lambda: float(fault(self.cfg, "snapshot_seconds", 0)))  # type: ignore[arg-type]
        finally:
            if frozen:
                lxcctl.thaw(self.cfg, vmid)
        with self.store.locked(vmid):
            conf = self.load(vmid)
            if conf.current.options.get("lock") != "snapshot":
                raise PveError("missing snapshot lock")
            conf.snapshots[name].options.pop("snapstate", None)
            conf.current.options.pop("lock")
            conf.current.options["parent"] = name
            self.store.write(vmid, conf)

    def delete_snapshot(self, vmid: int, name: str) -> Task:
        """API2/LXC/Snapshot.pm `delsnapshot`."""
        conf = self.load(vmid)
        if name not in conf.snapshots:
            raise PveError(f"snapshot '{name}' does not exist")
        return Task("vzdelsnapshot", str(vmid), "do_delete_snapshot", (vmid, name))

    def do_delete_snapshot(self, log: TaskLog, vmid: int, name: str) -> None:
        with self.store.locked(vmid):
            conf = self.load(vmid)
            if name not in conf.snapshots:
                raise PveError(f"snapshot '{name}' does not exist")
            gone = conf.snapshots.pop(name)
            # children of the removed snapshot now hang off its parent
            for section in [conf.current, *conf.snapshots.values()]:
                if section.options.get("parent") == name:
                    if gone.options.get("parent"):
                        section.options["parent"] = gone.options["parent"]
                    else:
                        section.options.pop("parent")
            self.store.write(vmid, conf)
