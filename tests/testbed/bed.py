"""Bring up and tear down a Proxmox-like node on loopback: sshd + real LXC + `pct`/`pvesh` doubles.

bed = Testbed.up(containers=2)      # or the `proxmox_testbed` pytest fixture
inventory = bed.inventory()         # for the dflash_pct connection (connection_plugins/)
...
bed.down()                          # stops what it started, by pid; removes its folder
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import registry
from .node import ha, lxcctl, tasks
from .node.nodecfg import ENV_VAR, NodeConfig, fault
from .node.ops import Node
from .node.pveconf import ConfigStore, CtConfig, Section, parse
from .node.storage import DEFAULT_STORAGE_CFG
from .procs import ProcRef
from .rootfs import SHIFT, ensure_rootfs, ensure_shifted_rootfs
from .shims import REPO_ROOT, write_shims
from .sshd import SshEndpoint, free_port, prepare_keys, start_sshd
from .teardown import reap_stale, teardown
from .tls import make_certificates

CT_WHEELHOUSE = "/mnt/wheelhouse"
# The API user and its privilege-separated token that the bed's inventory uses (bed.inventory).
API_USER = "dflash@pve"
API_TOKEN = "deploy"
# The project's pct transport (connection_plugins/dflash_pct.py, pipelining) and the plain one.
PCT_CONNECTION = "dflash_pct"
PLAIN_PCT_CONNECTION = "community.proxmox.proxmox_pct_remote"
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
    reasons += [_subordinate_ids_missing(path) for path in SUBORDINATE_ID_FILES]
    return [reason for reason in reasons if reason]


# With uidmap installed, LXC maps an unprivileged container's ids through newuidmap, which
# allows only the ranges these files give root; Proxmox VE ships `root:100000:65536` in both.
SUBORDINATE_ID_FILES = ("/etc/subuid", "/etc/subgid")
ID_RANGE = (SHIFT, SHIFT + 65536)


def _subordinate_ids_missing(path: str) -> str:
    """Why root may not map the unprivileged range here, or ''."""
    if shutil.which("newuidmap") is None:
        return ""  # LXC run as root writes the maps itself
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        owner, _, span = line.strip().partition(":")
        start, _, count = span.partition(":")
        if owner not in ("root", "0") or not (start.isdigit() and count.isdigit()):
            continue
        if int(start) <= ID_RANGE[0] and ID_RANGE[1] <= int(start) + int(count):
            return ""
    return (f"{path} gives root no ids {ID_RANGE[0]}-{ID_RANGE[1] - 1}, which newuidmap needs "
            f"for unprivileged containers (Proxmox VE ships it: "
            f"echo root:{ID_RANGE[0]}:65536 >> {path})")  # fmt: skip


def default_ct_config(vmid: int, wheelhouse: Path, unprivileged: bool = True) -> CtConfig:
    """A config as Proxmox writes it for a small Debian container on LVM-thin, with the node's
    wheelhouse bind-mounted (which, as on a real node, rules out snapshots). Unprivileged, as
    Proxmox creates containers by default (`unprivileged: 1`); privileged ones lack the key."""
    options = {
        "arch": "amd64",
        "cores": "2",
        "features": "nesting=1",
        "hostname": f"ct{vmid}",
        "memory": "2048",
        "mp0": f"{wheelhouse},mp={CT_WHEELHOUSE},ro=1",
        "net0": f"name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:{vmid // 256 % 256:02X}:"
        f"{vmid % 256:02X},ip=dhcp,type=veth",
        "ostype": "debian",
        "rootfs": f"local-lvm:vm-{vmid}-disk-0,size=8G",
        "swap": "512",
    }
    if unprivileged:
        options["unprivileged"] = "1"
    return CtConfig(Section(options))


def user_cfg(tokens: dict[str, dict[str, Any]]) -> str:
    """/etc/pve/user.cfg: the API user may administer every guest; each token (privilege
    separated unless said otherwise) only the paths its `acl` names ({path: role})."""
    lines = ["user:root@pam:1:0:::root@localhost::", f"user:{API_USER}:1:0::::dflash deploy::"]
    for name, spec in tokens.items():
        lines.append(f"token:{API_USER}!{name}:0:{int(spec.get('privsep', True))}::")
    lines.append(f"acl:1:/:{API_USER}:PVEVMAdmin:")
    for name, spec in tokens.items():
        for path, role in spec["acl"].items():
            lines.append(f"acl:1:{path}:{API_USER}!{name}:{role}:")
    return "\n".join(lines) + "\n"


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
    shifted_rootfs: Path  # the base owned by 100000+, for unprivileged containers
    api: ProcRef | None  # the HTTPS API server
    api_port: int
    privileged: list[int]  # the containers without `unprivileged: 1` (one, for comparison)
    tokens: dict[str, dict[str, Any]]  # API token name -> {secret, privsep, acl {path: role}}
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
    def ca_file(self) -> Path:
        """The cluster CA that signed the API's certificate: what a client trusts."""
        return self.node_cfg.etc_pve / "pve-root-ca.pem"

    @property
    def api_url(self) -> str:
        return f"https://{self.host}:{self.api_port}"

    @property
    def node_cfg(self) -> NodeConfig:
        return NodeConfig(self.node, str(self.root), str(self.base_rootfs),
                          str(self.shifted_rootfs), self.api_port)  # fmt: skip

    @property
    def store(self) -> ConfigStore:
        return ConfigStore(self.node_cfg.etc_pve, self.node)

    @property
    def trace_path(self) -> Path:
        return self.node_cfg.trace

    def hostname(self, vmid: int) -> str:
        """Inventory host name of a container."""
        return f"ct{vmid}"

    def unprivileged(self, vmid: int) -> bool:
        return vmid not in self.privileged

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
        """Start sshd, the HTTPS API and `containers` LXC containers (VMIDs from `vmid_base`
        on; unprivileged, but the last of two or more is privileged, for comparison).

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
        shifted = ensure_shifted_rootfs(base, log=log)
        root = Path(tempfile.mkdtemp(prefix=f"dflash-testbed-{name}-"))
        root.chmod(0o755)
        owner = None if persistent else ProcRef.of(os.getpid(), "bed owner")
        with registry.locked():
            vmids = _free_vmids(vmid_base, containers)
            # Recorded before anything starts, so a crash halfway still leaves a way to clean up.
            registry.save(name, {"name": name, "root": str(root), "vmids": vmids, "node": node,
                                 "owner": owner and owner.to_json(), "sshd": None})  # fmt: skip
        privileged = vmids[-1:] if containers >= 2 else []
        tokens = {API_TOKEN: {"secret": str(uuid.uuid4()), "privsep": True,
                              "acl": {f"/vms/{v}": "PVEVMAdmin" for v in vmids}}}  # fmt: skip
        cfg = NodeConfig(node, str(root), str(base), str(shifted), api_port=free_port())
        sshd = api = None
        try:
            for folder in (cfg.etc_pve / "priv", cfg.lxcpath, cfg.tasks, root / "wheelhouse"):
                folder.mkdir(parents=True, exist_ok=True)
            cfg.save()
            cfg.trace.touch()
            (cfg.etc_pve / "storage.cfg").write_text(DEFAULT_STORAGE_CFG)
            make_certificates(cfg.etc_pve, node)
            shim_sbin, shim_bin = write_shims(root)
            prepare_keys(root / "ssh")
            sshd, endpoint = start_sshd(root / "ssh", shim_sbin, shim_bin)
            registry.save(name, {**registry.load_all()[name], "sshd": sshd.to_json()})
            api = start_api(cfg)
            bed = cls(name, root, node, vmids, endpoint, sshd, base, shifted, api, cfg.api_port,
                      privileged, tokens, owner)  # fmt: skip
            registry.save(name, bed.state())
            bed.write_access()
            store = bed.store
            for vmid in vmids:
                store.folder.mkdir(parents=True, exist_ok=True)
                store.write(vmid, bed.default_config(vmid))
                lxcctl.start(cfg, vmid, store)
        except BaseException:
            teardown(name, root, vmids, node, [p for p in (sshd, api) if p], log)
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
        servers = [p for p in (self.sshd, self.api) if p]
        teardown(self.name, self.root, self.vmids, self.node, servers, log)

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name, "root": str(self.root), "node": self.node, "vmids": self.vmids,
            "owner": self.owner and self.owner.to_json(), "sshd": self.sshd.to_json(),
            "api": self.api and self.api.to_json(), "api_port": self.api_port,
            "base_rootfs": str(self.base_rootfs), "shifted_rootfs": str(self.shifted_rootfs),
            "host": self.host, "port": self.port, "user": self.user,
            "private_key": str(self.private_key), "known_hosts": str(self.known_hosts),
            "privileged": self.privileged, "tokens": self.tokens,
        }  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Testbed:
        endpoint = SshEndpoint(state["host"], state["port"], state["user"],
                               Path(state["private_key"]), Path(state["known_hosts"]))  # fmt: skip
        api = ProcRef.from_json(state["api"]) if state.get("api") else None
        return cls(state["name"], Path(state["root"]), state["node"], list(state["vmids"]),
                   endpoint, ProcRef.from_json(state["sshd"]), Path(state["base_rootfs"]),
                   Path(state["shifted_rootfs"]), api, int(state["api_port"]),
                   list(state["privileged"]), dict(state["tokens"]),
                   ProcRef.from_json(state["owner"]) if state.get("owner") else None)  # fmt: skip

    # --- API access -------------------------------------------------------------------------
    def write_access(self) -> None:
        """user.cfg and priv/token.cfg from `tokens` (the API reads them on every call)."""
        etc = self.node_cfg.etc_pve
        (etc / "user.cfg").write_text(user_cfg(self.tokens))
        secrets = "".join(f"{API_USER}!{n} {t['secret']}\n" for n, t in self.tokens.items())
        (etc / "priv" / "token.cfg").write_text(secrets)
        (etc / "priv" / "token.cfg").chmod(0o600)

    def add_token(self, name: str, acl: dict[str, str], privsep: bool = True) -> str:
        """A new API token of the API user with these ACL entries ({path: role}); its secret."""
        self.tokens[name] = {"secret": str(uuid.uuid4()), "privsep": privsep, "acl": dict(acl)}
        self.write_access()
        return str(self.tokens[name]["secret"])

    def token_secret(self, name: str = API_TOKEN) -> str:
        return str(self.tokens[name]["secret"])

    def delay_tasks(self, kind: str, seconds: float) -> None:
        """Fault injection: workers of tasks of this type (vzstart, vzsnapshot, ...) wait this
        long before they start; 0 ends the delay."""
        delays = dict(fault(self.node_cfg, "task_delay", {}))  # type: ignore[call-overload]
        self.set_fault("task_delay", {**delays, kind: seconds})

    def set_fault(self, key: str, value: object) -> None:
        """A setting the doubles read (nodecfg.fault): `task_delay`, `ha_start_delay` (s from
        an HA start request to the start), `snapshot_seconds` (how long a snapshot's volumes
        take, the container frozen meanwhile)."""
        path = self.root / "faults.json"
        faults = json.loads(path.read_text()) if path.exists() else {}
        faults[key] = value
        temp = path.with_suffix(".tmp")  # renamed into place: a double never reads half of it
        temp.write_text(json.dumps(faults))
        temp.rename(path)

    def task_results(self, kind: str, vmid: int | None = None) -> list[tuple[str, str]]:
        """(UPID, exit status) of every finished task of this type (and container), oldest
        first, as `/tasks/{upid}/status` reports them."""
        found = []
        for path in self.node_cfg.tasks.glob("*/UPID:*"):
            task = tasks.status(self.node_cfg, path.name) or {}
            mine = task.get("type") == kind and vmid in (None, int(str(task.get("id"))))
            if mine and task["status"] == "stopped":
                found.append((int(str(task["starttime"])), path.name, str(task["exitstatus"])))
        return [(upid, status) for _, upid, status in sorted(found)]

    def api_calls(self, since: int = 0) -> list[dict[str, Any]]:
        """The HTTPS API's calls since the mark: method (get/post/put/delete) and path."""
        return self.trace(since, tool="api")

    # --- inventory --------------------------------------------------------------------------
    def inventory(
        self,
        path: Path | None = None,
        group: str = "dflash_targets",
        vmids: Iterable[int] | None = None,
        port: int | None = None,
        group_vars: dict[str, Any] | None = None,
        host_vars: dict[int, dict[str, Any]] | None = None,
        connection: str = PCT_CONNECTION,
    ) -> Path:
        """Write an Ansible inventory (YAML) reaching the containers through pct over SSH.

        One host per container (`ct<vmid>`, with `proxmox_vmid`), in `group`. `port` overrides
        the SSH port (a closed one makes the node unreachable); `group_vars`/`host_vars` add or
        override variables. `connection` is the project's pipelining plugin `dflash_pct` unless
        a test asks for the plain `community.proxmox.proxmox_pct_remote` (PLAIN_PCT_CONNECTION).
        Also sets the `proxmox_api_*` variables of the node's HTTPS API
        (the privilege-separated token `dflash@pve!deploy`, the CA file to trust).
        """
        ssh_port = self.port if port is None else port
        common: dict[str, Any] = {
            "ansible_connection": connection,
            "ansible_host": self.host,
            "ansible_port": ssh_port,
            "ansible_user": self.user,
            "ansible_ssh_private_key_file": str(self.private_key),
            # a test bed's node: a fresh host key every bring-up (never for real nodes)
            "ansible_host_key_checking": False,
            "ansible_python_interpreter": "/usr/bin/python3",
            "proxmox_node": self.node,
            "proxmox_api_host": self.host,
            "proxmox_api_port": self.api_port,
            "proxmox_api_user": API_USER,
            "proxmox_api_token_id": API_TOKEN,
            "proxmox_api_token_secret": self.token_secret(),
            "proxmox_api_ca_file": str(self.ca_file),
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

    def ssh_connections(self, since: int = 0) -> set[str]:
        """The SSH connections (client address and port) that ran `pct` since the mark."""
        return {str(e["ssh"]) for e in self.trace(since, tool="pct") if e.get("ssh")}

    # --- containers (fault injection) ---------------------------------------------------
    def status(self, vmid: int) -> str:
        return lxcctl.info(self.node_cfg, vmid)[0]

    def stop_container(self, vmid: int) -> None:
        if self.status(vmid) == "running":
            lxcctl.stop(self.node_cfg, vmid)

    def start_container(self, vmid: int) -> None:
        """Start it as `pct start` does, pending changes applied first."""
        if self.status(vmid) != "running":
            Node(self.node_cfg).apply_pending(vmid)
            lxcctl.start(self.node_cfg, vmid, self.store)

    def ha_manage(self, vmid: int) -> None:
        """`ha-manager add ct:<vmid>`: its starts go through the HA stack (node/ha.py)."""
        ha.manage(self.node_cfg, vmid)

    def migrate(self, vmid: int, target: str) -> None:
        """`pct migrate <vmid> <target> --restart` (node/ops.py `migrate`)."""
        Node(self.node_cfg).migrate(vmid, target)

    def delete_container(self, vmid: int) -> None:
        """Stop it and remove its config and file system, as `pct destroy` would."""
        self.stop_container(vmid)
        self.store.path(vmid).unlink(missing_ok=True)
        shutil.rmtree(self.node_cfg.lxcpath / str(vmid), ignore_errors=True)

    def default_config(self, vmid: int) -> CtConfig:
        return default_ct_config(vmid, self.wheelhouse, self.unprivileged(vmid))

    def restore_container(self, vmid: int, start: bool = True) -> None:
        """Give a VMID of this bed its default config back (after a delete or config edits)."""
        if vmid not in self.vmids:
            raise ValueError(f"{vmid} is not one of this bed's containers {self.vmids}")
        self.store.write(vmid, self.default_config(vmid))
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
        """Every container of the bed back to its default config (no snapshots, nothing pending)
        and running, on this node and not HA-managed; API tokens other than the bed's own,
        fault settings and the task history removed."""
        self.tokens = {API_TOKEN: self.tokens[API_TOKEN]}
        self.write_access()
        (self.root / "faults.json").unlink(missing_ok=True)
        for name in ("resources.cfg", "manager_status"):
            (self.node_cfg.etc_pve / "ha" / name).unlink(missing_ok=True)
        # Each test counts the tasks it caused (task_results): the history starts empty.
        shutil.rmtree(self.node_cfg.tasks, ignore_errors=True)
        self.node_cfg.tasks.mkdir()
        for folder in (self.node_cfg.etc_pve / "nodes").iterdir():
            if folder.name != self.node:  # a node a container was migrated to
                shutil.rmtree(folder)
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


def start_api(cfg: NodeConfig) -> ProcRef:
    """The HTTPS API server (node/api.py) on 127.0.0.1:<cfg.api_port>, ready when it answers."""
    log = (Path(cfg.root) / "api.log").open("ab")
    env = {**os.environ, ENV_VAR: str(Path(cfg.root) / "node.json"), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.testbed.node.api"], stdin=subprocess.DEVNULL,
        stdout=log, stderr=log, env=env, start_new_session=True,
    )  # fmt: skip
    log.close()
    ref = ProcRef.of(proc.pid, "HTTPS API")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", cfg.api_port), timeout=0.5):
                return ref
        except OSError:
            time.sleep(0.05)
    tail = (Path(cfg.root) / "api.log").read_text(errors="replace")[-1500:]
    if proc.poll() is None:
        proc.kill()
    raise RuntimeError(f"the test bed's HTTPS API did not come up; its log ends with:\n{tail}")


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
