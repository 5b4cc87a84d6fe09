"""The container operations behind both doubles, with Proxmox's error texts.

Snapshots here are metadata only: a `[name]` section in the config (and `parent:` links), no copy
of the file system. That is all the deploy tooling reads back; rollback of a file system is not
emulated.
"""

from __future__ import annotations

import re
import time

from . import lxcctl
from .nodecfg import NodeConfig
from .pveconf import ConfigMissing, ConfigStore, CtConfig
from .tasks import run_task

SNAPNAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_\-]{1,40}$")


class PveError(RuntimeError):
    """An error the way Proxmox reports it: the message, and the exit code of the CLI."""

    def __init__(self, message: str, exit_code: int = 255) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def param(cls, key: str, problem: str) -> PveError:
        """A failed parameter check, which Proxmox reports with HTTP code 400."""
        return cls(f"400 Parameter verification failed.\n{key}: {problem}")


class Node:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.store = ConfigStore(cfg.etc_pve, cfg.node)

    # --- lookups ---------------------------------------------------------------------------
    def load(self, vmid: int) -> CtConfig:
        try:
            return self.store.load(vmid)
        except ConfigMissing as exc:
            raise PveError(str(exc), exit_code=2) from None

    def status(self, vmid: int) -> dict[str, object]:
        conf = self.load(vmid).current
        state, pid = lxcctl.info(self.cfg, vmid)
        data: dict[str, object] = {
            "vmid": vmid,
            "name": conf.options.get("hostname", f"CT{vmid}"),
            "status": state,
            "type": "lxc",
            "maxmem": int(conf.options.get("memory", "512")) * 1024 * 1024,
            "maxswap": int(conf.options.get("swap", "512")) * 1024 * 1024,
            "cpus": int(conf.options.get("cores", "1")),
            "uptime": self._uptime(vmid) if state == "running" else 0,
            "ha": {"managed": 0},
        }
        if pid:
            data["pid"] = pid
        if "lock" in conf.options:
            data["lock"] = conf.options["lock"]
        return data

    def _uptime(self, vmid: int) -> int:
        marker = self.cfg.lxcpath / str(vmid) / "config"
        try:
            return max(0, int(time.time() - marker.stat().st_mtime))
        except OSError:
            return 0

    def list(self) -> list[dict[str, object]]:
        return [self.status(vmid) for vmid in self.store.vmids()]

    # --- power -----------------------------------------------------------------------------
    def start(self, vmid: int) -> str:
        self.load(vmid)
        if lxcctl.info(self.cfg, vmid)[0] == "running":
            raise PveError(f"CT {vmid} already running")
        return run_task(
            self.cfg, "vzstart", str(vmid), lambda: lxcctl.start(self.cfg, vmid, self.store)
        )

    def stop(self, vmid: int, timeout_s: int | None = None) -> str:
        self.load(vmid)
        if lxcctl.info(self.cfg, vmid)[0] != "running":
            raise PveError(f"CT {vmid} not running")
        kind = "vzstop" if timeout_s is None else "vzshutdown"
        return run_task(self.cfg, kind, str(vmid), lambda: lxcctl.stop(self.cfg, vmid, timeout_s))

    # --- config ----------------------------------------------------------------------------
    def config(self, vmid: int, snapshot: str | None = None) -> dict[str, object]:
        conf = self.load(vmid)
        if snapshot is None:
            section = conf.current
        elif snapshot in conf.snapshots:
            section = conf.snapshots[snapshot]
        else:
            raise PveError(f"snapshot '{snapshot}' does not exist")
        data = section.to_api()
        data["digest"] = self.store.digest_of(vmid)
        return data

    def set_config(self, vmid: int, values: dict[str, str], delete: list[str]) -> None:
        for key in [*values, *delete]:
            if key.startswith("lxc"):
                raise PveError.param(
                    key,
                    "property is not defined in schema and the schema does not allow "
                    "additional properties",
                )
        with self.store.locked(vmid):
            conf = self.load(vmid)
            conf.current.options.update(values)
            for key in delete:
                conf.current.options.pop(key, None)
            self.store.write(vmid, conf)

    # --- snapshots -------------------------------------------------------------------------
    def snapshots(self, vmid: int) -> list[dict[str, object]]:
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
            "running": 1 if lxcctl.info(self.cfg, vmid)[0] == "running" else 0,
        }
        if conf.current.options.get("parent"):
            current["parent"] = conf.current.options["parent"]
        result.append(current)
        return result

    def snapshot(self, vmid: int, name: str, description: str = "") -> str:
        if not SNAPNAME.match(name):
            raise PveError.param("snapname", f"invalid format - invalid configuration ID '{name}'")
        self.load(vmid)

        def work() -> None:
            with self.store.locked(vmid):
                conf = self.load(vmid)
                if name in conf.snapshots or name == "current":
                    raise PveError(f"snapshot name '{name}' already used")
                if "lock" in conf.current.options:
                    raise PveError(f"CT is locked ({conf.current.options['lock']})")
                snap = conf.current.copy()
                snap.options["snaptime"] = str(int(time.time()))
                snap.description = description
                conf.snapshots[name] = snap
                conf.current.options["parent"] = name
                self.store.write(vmid, conf)

        return run_task(self.cfg, "vzsnapshot", str(vmid), work)

    def delete_snapshot(self, vmid: int, name: str) -> str:
        conf = self.load(vmid)
        if name not in conf.snapshots:
            raise PveError(f"snapshot '{name}' does not exist")

        def work() -> None:
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

        return run_task(self.cfg, "vzdelsnapshot", str(vmid), work)
