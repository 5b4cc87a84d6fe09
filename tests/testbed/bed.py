"""Bring up and tear down a Proxmox-like node on loopback: sshd + real LXC + `pct`/`pvesh` doubles.

bed = Testbed.up(containers=2)      # or the `proxmox_testbed` pytest fixture
inventory = bed.inventory()         # for community.proxmox.proxmox_pct_remote
...
bed.down()                          # stops what it started, by pid; removes its folder
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import registry
from .node import lxcctl
from .node.nodecfg import ENV_VAR, NodeConfig
from .node.pveconf import ConfigStore, CtConfig, Section, parse
from .procs import ProcRef
from .rootfs import ensure_rootfs
from .shims import REPO_ROOT, write_shims
from .sshd import SshEndpoint, prepare_keys, start_sshd
from .teardown import reap_stale, teardown

CT_WHEELHOUSE = "/mnt/wheelhouse"
REQUIRED_TOOLS = ("lxc-start", "lxc-stop", "lxc-info", "lxc-attach", "unshare", "mount",
                  "ssh-keygen", "debootstrap", "dpkg")  # fmt: skip


def missing_prerequisites() -> list[str]:
    """Why the bed cannot come up here (empty when it can)."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("needs root (LXC containers, mount namespaces)")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if not Path("/usr/sbin/sshd").exists():
        missing.append("sshd (/usr/sbin/sshd)")
    if not Path(lxcctl.INIT_STATIC).exists():
        missing.append(lxcctl.INIT_STATIC)
    if missing:
        reasons.append("missing: " + ", ".join(missing) + " (apt-get install lxc debootstrap "
                       "openssh-server)")  # fmt: skip
    return reasons


def default_ct_config(vmid: int, wheelhouse: Path) -> CtConfig:
    """A config as Proxmox writes it for a small Debian container with the wheelhouse mounted.

    Proxmox creates unprivileged containers by default; these are privileged (no `unprivileged`
    key), which is the one difference a deploy may notice (file ownership as seen on the node).
    """
    return CtConfig(
        Section(
            {
                "arch": "amd64",
                "cores": "2",
                "features": "nesting=1",
                "hostname": f"ct{vmid}",
                "memory": "2048",
                "mp0": f"{wheelhouse},mp={CT_WHEELHOUSE},ro=1",
                "net0": f"name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:{vmid // 256 % 256:02X}:"
                f"{vmid % 256:02X},ip=dhcp,type=veth",
                "ostype": "debian",
                "rootfs": f"local-zfs:subvol-{vmid}-disk-0,size=8G",
                "swap": "512",
            }
        )
    )


@dataclass
class Testbed:
    """One node on loopback. Attributes are what a test needs to reach it."""

    __test__ = False  # not a pytest test class, despite the name

    name: str
    root: Path  # the bed's private folder (configs, LXC state, keys, trace)
    node: str  # Proxmox node name
    vmids: list[int]
    ssh: SshEndpoint
    sshd: ProcRef
    base_rootfs: Path
    owner: ProcRef | None = None  # the process whose end makes this bed stale (None: CLI bed)
    _down: bool = field(default=False, repr=False)

    # --- what tests read -------------------------------------------------------------------
    @property
    def host(self) -> str:
        return self.ssh.host

    @property
    def port(self) -> int:
        return self.ssh.port

    @property
    def user(self) -> str:
        return self.ssh.user

    @property
    def private_key(self) -> Path:
        return self.ssh.private_key

    @property
    def known_hosts(self) -> Path:
        return self.ssh.known_hosts

    @property
    def wheelhouse(self) -> Path:
        """The node-side wheelhouse folder (writable here), mounted read-only in every container."""
        return self.root / "wheelhouse"

    @property
    def wheelhouse_ct(self) -> str:
        return CT_WHEELHOUSE

    @property
    def node_cfg(self) -> NodeConfig:
        return NodeConfig(node=self.node, root=str(self.root), base_rootfs=str(self.base_rootfs))

    @property
    def store(self) -> ConfigStore:
        return ConfigStore(self.node_cfg.etc_pve, self.node)

    @property
    def trace_path(self) -> Path:
        return self.node_cfg.trace

    def hostname(self, vmid: int) -> str:
        """Inventory host name of a container."""
        return f"ct{vmid}"

    # --- bring-up ---------------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        containers: int = 2,
        name: str | None = None,
        node: str = "pve",
        vmid_base: int = 200,
        persistent: bool = False,
        log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
    ) -> Testbed:
        """Start sshd and `containers` LXC containers (VMIDs from `vmid_base` on).

        The bed belongs to this process: it is torn down at exit (atexit) and, should this
        process be killed, by the next bring-up. `persistent=True` (the CLI) leaves it up
        until `python -m tests.testbed down`.
        """
        if not 1 <= containers <= 8:
            raise ValueError("containers must be between 1 and 8")
        problems = missing_prerequisites()
        if problems:
            raise RuntimeError("test bed cannot run here: " + "; ".join(problems))
        reap_stale(log)
        name = name or f"pid{os.getpid()}"
        if registry.path_for(name).exists():
            raise RuntimeError(
                f"a test bed named {name!r} is already up ({registry.path_for(name)}); "
                "stop it with: python -m tests.testbed down"
            )
        base = ensure_rootfs(log=log)
        root = Path(tempfile.mkdtemp(prefix=f"dflash-testbed-{name}-"))
        root.chmod(0o755)
        cfg = NodeConfig(node=node, root=str(root), base_rootfs=str(base))
        owner = None if persistent else ProcRef.of(os.getpid(), "bed owner")
        with registry.locked():
            vmids = _free_vmids(vmid_base, containers)
            # Recorded before anything starts, so a crash halfway still leaves a way to clean up.
            registry.save(name, {"name": name, "root": str(root), "vmids": vmids, "node": node,
                                 "owner": owner and owner.to_json(), "sshd": None})  # fmt: skip
        sshd = None
        try:
            for folder in (cfg.etc_pve, cfg.lxcpath, cfg.tasks, root / "wheelhouse"):
                folder.mkdir(parents=True, exist_ok=True)
            cfg.save()
            cfg.trace.touch()
            shim_sbin, shim_bin = write_shims(root)
            prepare_keys(root / "ssh")
            sshd, endpoint = start_sshd(root / "ssh", shim_sbin, shim_bin)
            bed = cls(name, root, node, vmids, endpoint, sshd, base, owner)
            registry.save(name, bed.state())
            store = bed.store
            for vmid in vmids:
                store.folder.mkdir(parents=True, exist_ok=True)
                store.write(vmid, default_ct_config(vmid, bed.wheelhouse))
                lxcctl.start(cfg, vmid, store)
        except BaseException:
            teardown(name, root, vmids, node, sshd, log)
            raise
        if not persistent:
            atexit.register(bed.down)
        return bed

    # --- tear-down --------------------------------------------------------------------------
    def down(self, log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)) -> None:
        if self._down:
            return
        self._down = True
        atexit.unregister(self.down)
        teardown(self.name, self.root, self.vmids, self.node, self.sshd, log)

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name, "root": str(self.root), "node": self.node, "vmids": self.vmids,
            "owner": self.owner and self.owner.to_json(), "sshd": self.sshd.to_json(),
            "base_rootfs": str(self.base_rootfs), "host": self.host, "port": self.port,
            "user": self.user, "private_key": str(self.private_key),
            "known_hosts": str(self.known_hosts),
        }  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Testbed:
        endpoint = SshEndpoint(state["host"], state["port"], state["user"],
                               Path(state["private_key"]), Path(state["known_hosts"]))  # fmt: skip
        return cls(state["name"], Path(state["root"]), state["node"], list(state["vmids"]),
                   endpoint, ProcRef.from_json(state["sshd"]), Path(state["base_rootfs"]),
                   ProcRef.from_json(state["owner"]) if state.get("owner") else None)  # fmt: skip

    # --- inventory --------------------------------------------------------------------------
    def inventory(
        self,
        path: Path | None = None,
        group: str = "dflash_targets",
        vmids: Iterable[int] | None = None,
        port: int | None = None,
        group_vars: dict[str, Any] | None = None,
        host_vars: dict[int, dict[str, Any]] | None = None,
    ) -> Path:
        """Write an Ansible inventory (YAML) reaching the containers through pct over SSH.

        One host per container (`ct<vmid>`, with `proxmox_vmid`), in `group`. `port` overrides
        the SSH port (a closed one makes the node unreachable); `group_vars`/`host_vars` add or
        override variables. Also sets `proxmox_api_*` variables for the dflash_proxmox module's
        ssh backend, and `dflash_wheelhouse` (the container-side wheelhouse path).
        """
        ssh_port = self.port if port is None else port
        common: dict[str, Any] = {
            "ansible_connection": "community.proxmox.proxmox_pct_remote",
            "ansible_host": self.host,
            "ansible_port": ssh_port,
            "ansible_user": self.user,
            "ansible_ssh_private_key_file": str(self.private_key),
            "ansible_host_key_checking": False,
            "ansible_python_interpreter": "/usr/bin/python3",
            "proxmox_node": self.node,
            "proxmox_api_backend": "ssh_paramiko",
            "proxmox_api_host": self.host,
            "proxmox_api_port": ssh_port,
            "proxmox_api_user": self.user,
            "proxmox_api_private_key_file": str(self.private_key),
            "dflash_wheelhouse": self.wheelhouse_ct,
        }
        common.update(group_vars or {})
        hosts = {
            self.hostname(vmid): {"proxmox_vmid": vmid, **(host_vars or {}).get(vmid, {})}
            for vmid in (self.vmids if vmids is None else vmids)
        }
        data = {"all": {"children": {group: {"hosts": hosts, "vars": common}}}}
        target = path or self.root / "inventory.yml"
        # JSON is valid YAML: no YAML library needed, and nothing to escape by hand.
        target.write_text(json.dumps(data, indent=2) + "\n")
        return target

    # --- trace of the doubles --------------------------------------------------------------
    def trace(self, since: int = 0, tool: str | None = None) -> list[dict[str, Any]]:
        """Entries of the doubles' trace (one per pct/pvesh call), from line `since` on."""
        lines = self.trace_path.read_text().splitlines()[since:]
        entries = [json.loads(line) for line in lines if line]
        return [e for e in entries if tool is None or e["tool"] == tool]

    def trace_mark(self) -> int:
        """A position in the trace: pass it as `since` to see only later calls."""
        return len(self.trace_path.read_text().splitlines())

    def pct_exec_counts(self, since: int = 0) -> Counter[int]:
        """Number of `pct exec` calls per VMID since the mark."""
        return Counter(
            int(e["vmid"])
            for e in self.trace(since, tool="pct")
            if e["subcommand"] == "exec" and str(e["vmid"]).isdigit()
        )

    # --- containers (fault injection) ---------------------------------------------------
    def status(self, vmid: int) -> str:
        return lxcctl.info(self.node_cfg, vmid)[0]

    def stop_container(self, vmid: int) -> None:
        if self.status(vmid) == "running":
            lxcctl.stop(self.node_cfg, vmid)

    def start_container(self, vmid: int) -> None:
        if self.status(vmid) != "running":
            lxcctl.start(self.node_cfg, vmid, self.store)

    def delete_container(self, vmid: int) -> None:
        """Stop it and remove its config and file system, as `pct destroy` would."""
        self.stop_container(vmid)
        self.store.path(vmid).unlink(missing_ok=True)
        shutil.rmtree(self.node_cfg.lxcpath / str(vmid), ignore_errors=True)

    def restore_container(self, vmid: int, start: bool = True) -> None:
        """Give a VMID of this bed its default config back (after a delete or config edits)."""
        if vmid not in self.vmids:
            raise ValueError(f"{vmid} is not one of this bed's containers {self.vmids}")
        self.store.write(vmid, default_ct_config(vmid, self.wheelhouse))
        if start:
            self.start_container(vmid)

    def read_config(self, vmid: int) -> CtConfig:
        return self.store.load(vmid)

    def config_text(self, vmid: int) -> str:
        return self.store.read_text(vmid)

    def write_config(self, vmid: int, conf: CtConfig | str) -> None:
        """Replace a container's Proxmox config (takes effect for LXC at the next start)."""
        self.store.write(vmid, parse(conf) if isinstance(conf, str) else conf)

    def edit_config(
        self,
        vmid: int,
        values: dict[str, str] | None = None,
        delete: Iterable[str] = (),
        lxc: Iterable[tuple[str, str]] = (),
        drop_lxc: bool = False,
    ) -> CtConfig:
        """Set/delete keys of the current config; `lxc` appends raw `lxc.*` lines."""
        with self.store.locked(vmid):
            conf = self.store.load(vmid)
            conf.current.options.update(values or {})
            for key in delete:
                conf.current.options.pop(key, None)
            if drop_lxc:
                conf.current.lxc.clear()
            conf.current.lxc.extend(lxc)
            self.store.write(vmid, conf)
        return conf

    def snapshots(self, vmid: int) -> list[str]:
        return list(self.store.load(vmid).snapshots)

    def reset(self) -> None:
        """Every container of the bed back to its default config (no snapshots) and running."""
        for vmid in self.vmids:
            self.restore_container(vmid, start=True)

    # --- running things ---------------------------------------------------------------------
    def attach(
        self, vmid: int, *command: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in a container directly (lxc-attach; not through SSH, not traced)."""
        return subprocess.run(
            self.node_cfg.attach_argv(vmid, list(command)),
            capture_output=True, text=True, check=check, timeout=60,
        )  # fmt: skip

    def ssh_run(self, command: str | list[str], timeout: float = 60) -> tuple[int, str, str]:
        """Run a command on the node through its sshd, as proxmoxer and the plugin do."""
        import paramiko  # the controller's dependency; only needed here

        if not isinstance(command, str):
            command = shlex.join(command)
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(self.host, port=self.port, username=self.user,
                       key_filename=str(self.private_key), look_for_keys=False,
                       allow_agent=False, timeout=10)  # fmt: skip
        try:
            _, stdout, stderr = client.exec_command(command, timeout=timeout)
            out = stdout.read().decode()
            err = stderr.read().decode()
            return stdout.channel.recv_exit_status(), out, err
        finally:
            client.close()

    def env(self) -> dict[str, str]:
        """Environment that lets a process on this machine run the doubles directly."""
        return {ENV_VAR: str(self.root / "node.json"), "PYTHONPATH": str(REPO_ROOT)}


def _free_vmids(base: int, count: int) -> list[int]:
    """VMIDs no other live bed uses (LXC names and cgroups are per VMID on this host)."""
    taken = {int(v) for state in registry.load_all().values() for v in state.get("vmids", [])}
    vmids: list[int] = []
    candidate = base
    while len(vmids) < count:
        if candidate not in taken:
            vmids.append(candidate)
        candidate += 1
    return vmids
