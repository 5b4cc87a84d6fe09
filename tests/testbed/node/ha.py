"""High availability on the bed: which containers the HA stack manages and how it starts them.

pve-ha-manager keeps its resources in /etc/pve/ha/resources.cfg (a SectionConfig:
`ct: 200` then indented `state started`, src/PVE/HA/Config.pm). For a managed container,
pve-container API2/LXC/Status.pm `vm_start` runs no start itself: its `hastart` task prints
`Requesting HA start for CT <vmid>`, runs `ha-manager set ct:<vmid> --state started` and ends
OK, and the container runs only once the CRM has told the node's LRM to start it, which the LRM
does through the same `vm_start` (rpcenv type `ha`: a `vzstart` task as root@pam, with its lock
check) - on a real cluster 10-20 s later, one CRM and one LRM round. The bed's LRM is a detached
`python -m tests.testbed.node.ha VMID` that waits `ha_start_delay` seconds (faults.json,
default DEFAULT_START_DELAY) and then is that `vzstart` worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .nodecfg import NodeConfig, fault

DEFAULT_START_DELAY = 2.0


def _path(cfg: NodeConfig) -> Path:
    return cfg.etc_pve / "ha" / "resources.cfg"


def resources(cfg: NodeConfig) -> dict[str, dict[str, str]]:
    """resources.cfg as {'ct:200': {'state': 'started'}, ...}."""
    try:
        text = _path(cfg).read_text()
    except FileNotFoundError:
        return {}
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line:
            kind, _, name = line.partition(":")
            current = found.setdefault(f"{kind.strip()}:{name.strip()}", {})
        elif line.strip() and current is not None:
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return found


def _write(cfg: NodeConfig, found: dict[str, dict[str, str]]) -> None:
    path = _path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(
        f"{sid.replace(':', ': ', 1)}\n" + "".join(f"\t{k} {v}\n" for k, v in opts.items()) + "\n"
        for sid, opts in found.items()
    )
    _replace(path, text)


def _replace(path: Path, text: str) -> None:
    """Write whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def manage(cfg: NodeConfig, vmid: int, state: str = "started") -> None:
    """`ha-manager add ct:<vmid> --state <state>`."""
    found = resources(cfg)
    found[f"ct:{vmid}"] = {"state": state}
    _write(cfg, found)


def set_state(cfg: NodeConfig, vmid: int, state: str) -> None:
    """`ha-manager set ct:<vmid> --state <state>`."""
    found = resources(cfg)
    found.setdefault(f"ct:{vmid}", {})["state"] = state
    _write(cfg, found)


def _manager_path(cfg: NodeConfig) -> Path:
    return cfg.etc_pve / "ha" / "manager_status"


def _manager(cfg: NodeConfig) -> dict:
    path = _manager_path(cfg)
    return json.loads(path.read_text()) if path.exists() else {}


def set_service_state(cfg: NodeConfig, vmid: int, state: str) -> None:
    """The CRM's view of a service in /etc/pve/ha/manager_status (JSON): `request_start`,
    `started`, or `error` once a start failed (max_restart 1 by default, then no retry)."""
    manager = _manager(cfg)
    manager.setdefault("service_status", {})[f"ct:{vmid}"] = {"state": state}
    _replace(_manager_path(cfg), json.dumps(manager))


def status(cfg: NodeConfig, vmid: int) -> dict[str, object]:
    """HA/Config.pm `get_service_status`, as LXC.pm `vmstatus` reports it under `ha`: the
    resource's own settings, its state as the CRM has it where it has one."""
    entry = resources(cfg).get(f"ct:{vmid}")
    if entry is None:
        return {"managed": 0}
    service = _manager(cfg).get("service_status", {}).get(f"ct:{vmid}", {})
    return {"managed": 1, "state": service.get("state", entry.get("state", "started"))}


def request_start(cfg: NodeConfig, vmid: int) -> None:
    """Hand the start to the bed's LRM, which outlives the hastart task."""
    from .tasks import worker_env

    subprocess.Popen(
        [sys.executable, "-S", "-m", "tests.testbed.node.ha", str(vmid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=worker_env(cfg), start_new_session=True,
    )  # fmt: skip


def main() -> None:
    """The LRM's start of one container: after the CRM's delay, a vzstart task as root@pam."""
    from .ops import Node
    from .tasks import run

    vmid = int(sys.argv[1])
    node = Node(NodeConfig.load())
    time.sleep(float(fault(node.cfg, "ha_start_delay", DEFAULT_START_DELAY)))  # type: ignore[arg-type]
    if resources(node.cfg).get(f"ct:{vmid}", {}).get("state") != "started" or node.running(vmid):
        return
    _, final = run(node.cfg, "vzstart", str(vmid), "root@pam", lambda log: node.do_start(log, vmid))
    set_service_state(node.cfg, vmid, "error" if final.startswith("TASK ERROR") else "started")


if __name__ == "__main__":
    main()
