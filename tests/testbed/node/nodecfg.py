"""Where one test node keeps its state; written by the bring-up, read by the doubles.

The shims export DFLASH_TESTBED_NODE=<root>/node.json, so the doubles need no other input. This
module stays free of heavy imports: `pct exec` goes through it on every Ansible task.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

ENV_VAR = "DFLASH_TESTBED_NODE"
# What Proxmox's CLIHandler sets before running lxc-attach (PVE::CLIHandler::run_cli_handler).
CT_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"


class NodeConfig:
    """node: the Proxmox node name; root: the bed's folder; base_rootfs: the shared base tree;
    shifted_rootfs: its copy owned by uid/gid 100000+ (unprivileged containers); api_port: the
    HTTPS API's port."""

    __slots__ = ("api_port", "base_rootfs", "node", "root", "shifted_rootfs")

    def __init__(self, node: str, root: str, base_rootfs: str, shifted_rootfs: str = "",
                 api_port: int = 0) -> None:  # fmt: skip
        self.node = node
        self.root = root
        self.base_rootfs = base_rootfs
        self.shifted_rootfs = shifted_rootfs
        self.api_port = api_port

    @property
    def etc_pve(self) -> Path:
        return Path(self.root) / "etc" / "pve"

    @property
    def lxcpath(self) -> Path:
        """LXC's `-P` folder: one `<vmid>/config` derived from each Proxmox config."""
        return Path(self.root) / "lxc"

    @property
    def tasks(self) -> Path:
        return Path(self.root) / "tasks"

    @property
    def trace(self) -> Path:
        return Path(self.root) / "trace.jsonl"

    def conf_path(self, vmid: int) -> Path:
        return self.etc_pve / "nodes" / self.node / "lxc" / f"{vmid}.conf"

    def missing_message(self, vmid: int) -> str:
        """Proxmox's text for a VMID without a config on this node."""
        return f"Configuration file 'nodes/{self.node}/lxc/{vmid}.conf' does not exist"

    def init_running(self, vmid: int) -> bool:
        """Whether the container's init (recorded at its start: pid and start time) still
        lives: PVE::LXC::check_running's question, without starting lxc-info."""
        try:
            pid, started = (self.lxcpath / str(vmid) / "init").read_text().split()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError):
            return False
        fields = stat.rsplit(")", 1)[1].split()
        return fields[0] != "Z" and fields[19] == started

    def attach_argv(self, vmid: int, command: list[str]) -> list[str]:
        """lxc-attach with a clean environment, for the bed's own use (tests, not `pct`)."""
        return [
            "lxc-attach", "-n", str(vmid), "-P", str(self.lxcpath), "--clear-env",
            "--set-var", f"PATH={CT_PATH}", "--set-var", "HOME=/root",
            "--set-var", "LANG=C.UTF-8", "--keep-var", "TERM", "--", *command,
        ]  # fmt: skip

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "root": self.root, "base_rootfs": self.base_rootfs,
                "shifted_rootfs": self.shifted_rootfs, "api_port": self.api_port}  # fmt: skip

    def save(self) -> Path:
        path = Path(self.root) / "node.json"
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> NodeConfig:
        path = path or os.environ.get(ENV_VAR)
        if not path:
            raise RuntimeError(f"{ENV_VAR} is not set: this double runs only inside the test bed")
        return cls(**json.loads(Path(path).read_text()))


def fault(cfg: NodeConfig, key: str, default: object) -> object:
    """A fault-injection setting of the bed (faults.json, written by Testbed), or `default`."""
    path = Path(cfg.root) / "faults.json"
    try:
        return json.loads(path.read_text()).get(key, default)
    except FileNotFoundError:
        return default


def hold(seconds: Callable[[], float]) -> None:
    """Wait as long as `seconds()` says, read again as it waits: a fault a test set long is
    ended by the test setting it to 0, so the double does not outwait a loaded machine."""
    began = time.monotonic()
    while time.monotonic() - began < seconds():
        time.sleep(0.05)
