"""Real LXC under the doubles: derive each LXC config from its Proxmox config, start, stop, query.

Derived as pve-container src/PVE/LXC.pm `update_lxc_config` does where it matters:
- `unprivileged: 1` maps uid/gid 0 to 100000 (65536 ids); the root file system is then an
  overlay on a copy of the base whose owners are shifted by 100000 (rootfs.py), so that root in
  the container owns its files and node files bind-mounted in appear as nobody (65534);
- `devN` needs the device on the node (LXC/Tools.pm `get_device_mode_and_rdev`: "Device ...
  does not exist" fails the start of a config edited by hand; since pve-container 5.0.10 setting
  it is refused too, see ops.py) and gets a `c MAJOR:MINOR rw` device rule;
- a new `mpN` set while the container runs is hotplugged (`hotplug_mount`, as LXC.pm
  `mountpoint_hotplug` does: a clone of the source's mount moved into the container's mount
  namespace);
- device rules: Proxmox VE 8 runs cgroup v2, where only `lxc.cgroup2.devices.*` rules count and
  `lxc.cgroup.*` (v1) keys are ignored. This machine mounts cgroup v1, so the bed enforces the
  container's cgroup2 device rules (after LXC's default list from common.conf) through the v1
  devices controller, which this kernel has, and drops its v1 keys as PVE 8 would ignore them;
  other `lxc.cgroup2.*` keys (memory, cpu) cannot be enforced here and are left out;
- `memory` (and `swap`) limit the container's memory cgroup (`memory_limit`), so an
  over-limit process is OOM-killed as on a node, and the container reads its own OOM count;
- a Debian newer than pve-container knows (LXC/Setup/Debian.pm: above 14) starts with a warning.
Differences on purpose: a container with a `netN` shares the node's network namespace (LXC's
`none`) instead of a veth on the bridge: the bed's stand-in for `vmbr0`, so the containers of a
job reach each other (and the node) at 127.0.0.1; without one it has only loopback (`empty`).
Cores (cpuset) are not enforced; storage volumes are folders under the bed.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

from .nodecfg import NodeConfig
from .pveconf import ConfigStore, Section, parse_property_string
from .storage import volume_folder

TYPE_CHECKING = False  # not from typing: see cli.py
if TYPE_CHECKING:
    from .tasks import TaskLog

INIT_STATIC = "/usr/sbin/init.lxc.static"
ID_SHIFT = 100000
# /usr/share/lxc/config/common.conf's device list, which every Proxmox container includes.
DEFAULT_DEVICE_RULES = [
    ("deny", "a"), ("allow", "c *:* m"), ("allow", "b *:* m"), ("allow", "c 1:3 rwm"),
    ("allow", "c 1:5 rwm"), ("allow", "c 1:7 rwm"), ("allow", "c 5:0 rwm"),
    ("allow", "c 5:1 rwm"), ("allow", "c 5:2 rwm"), ("allow", "c 1:8 rwm"),
    ("allow", "c 1:9 rwm"), ("allow", "c 136:* rwm"), ("allow", "c 10:229 rwm"),
]  # fmt: skip
# The node's memory controller: cgroup v1's folder, or cgroup v2's list of controllers.
MEMCG_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2_CONTROLLERS = Path("/sys/fs/cgroup/cgroup.controllers")
DEBIAN_MAXIMUM_RELEASE = 14  # LXC/Setup/Debian.pm, a soft limit: a newer one warns


class LxcError(RuntimeError):
    pass


def unprivileged(section: Section) -> bool:
    return section.options.get("unprivileged") in ("1", "true", "yes", "on")


def device_number(path: str) -> tuple[str, int, int]:
    """(b|c, major, minor) of a device node on the node (Tools.pm `get_device_mode_and_rdev`)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise LxcError(f"Device {path} does not exist") from None
    if not (stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)):
        raise LxcError(f"{path} is not a device")
    kind = "b" if stat.S_ISBLK(info.st_mode) else "c"
    return kind, os.major(info.st_rdev), os.minor(info.st_rdev)


def mount_source(node: NodeConfig, key: str, value: str, unpriv: bool) -> tuple[str, str, bool]:
    """(node-side source, absolute target, read-only) of an `mpN` value; a storage volume is a
    folder of the bed, created on first use."""
    mount = parse_property_string(value, "volume")
    source, target = mount["volume"], mount.get("mp", "")
    if not target.startswith("/"):
        raise LxcError(f"{key}: mount point target must be an absolute path: {value}")
    if not source.startswith("/"):  # a storage volume: a folder of the bed
        source = str(prepare_volume(node, source, unpriv))
    return source, target, mount.get("ro") in ("1", "true", "yes", "on")


def cgroup_name(node: NodeConfig, vmid: int, part: str) -> str:
    """The cgroup folder of a container (`payload`) or of its LXC monitor (`monitor`), named
    after the bed: LXC's default `lxc.payload.<vmid>` is taken by a folder another bed left
    behind or by a bed running beside this one with the same vmids, and LXC then silently
    makes `lxc.payload.<vmid>-1` (Proxmox VE 8 names them `lxc/<vmid>` and `lxc.monitor/<vmid>`,
    one node per machine)."""
    return f"{Path(node.root).name}.{part}.{vmid}"


def cgroup_folders(root: Path) -> list[Path]:
    """The cgroup folders of a bed's containers and monitors left in any hierarchy (LXC removes
    them when a container stops; a killed monitor leaves them), deepest first."""
    found = [path for hierarchy in Path("/sys/fs/cgroup").iterdir() if hierarchy.is_dir()
             for path in hierarchy.glob(f"{root.name}.*") if path.is_dir()]  # fmt: skip
    nested = [sub for path in found for sub in path.rglob("*") if sub.is_dir()]
    return sorted(found + nested, key=lambda path: len(path.parts), reverse=True)


def memory_limit(node: NodeConfig, vmid: int, opts: dict[str, str], shared_net: bool) -> list[str]:
    """LXC.pm `update_lxc_config`: the container's memory limit from `memory`, and memory +
    swap from `swap` (`// 0`), in the keys of the node's cgroup version, so the kernel
    OOM-kills inside a container that goes over it. A container that sees the node's /sys
    (shared network) gets its own memory cgroup bound over the node's, as its cgroup
    namespace shows it on Proxmox VE 8: its memory.oom_control counts its own OOM kills.
    (PVE 8's cgroup v2 `memory.high`, a soft limit at a fraction of `memory`, is left out.)"""
    memory, swap = int(opts.get("memory", "512")), int(opts.get("swap", "0"))
    if (MEMCG_V1 / "memory.limit_in_bytes").exists():
        lines = [f"lxc.cgroup.memory.limit_in_bytes = {memory << 20}"]
        if (MEMCG_V1 / "memory.memsw.limit_in_bytes").exists():  # swap accounting on
            lines.append(f"lxc.cgroup.memory.memsw.limit_in_bytes = {(memory + swap) << 20}")
        if shared_net:
            own = MEMCG_V1 / cgroup_name(node, vmid, "payload")
            lines.append(f"lxc.mount.entry = {own} sys/fs/cgroup/memory none bind 0 0")
        return lines
    if CGROUP_V2_CONTROLLERS.exists() and "memory" in CGROUP_V2_CONTROLLERS.read_text().split():
        return [f"lxc.cgroup2.memory.max = {memory << 20}",
                f"lxc.cgroup2.memory.swap.max = {swap << 20}"]  # fmt: skip
    return []


def change_memory_limit(node: NodeConfig, vmid: int, opts: dict[str, str]) -> None:
    """LXC/Cgroup.pm `change_memory_limit`, as `vmconfig_hotplug_pending` runs it for a
    `memory` or `swap` set on a running container (cgroup v1: memory + swap may never be
    below memory, so the order of the two writes follows the direction of the change)."""
    folder = MEMCG_V1 / cgroup_name(node, vmid, "payload")
    if not (folder / "memory.limit_in_bytes").exists():
        return
    memory, swap = int(opts.get("memory", "512")), int(opts.get("swap", "0"))
    writes = [("memory.memsw.limit_in_bytes", (memory + swap) << 20),
              ("memory.limit_in_bytes", memory << 20)]  # fmt: skip
    if memory << 20 < int((folder / "memory.limit_in_bytes").read_text()):
        writes.reverse()
    for name, value in writes:
        if (folder / name).exists():
            (folder / name).write_text(str(value))


def derive_lxc_config(vmid: int, section: Section, node: NodeConfig) -> str:
    ct_dir = node.lxcpath / str(vmid)
    opts = section.options
    unpriv = unprivileged(section)
    base = node.shifted_rootfs if unpriv else node.base_rootfs
    shared_net = any(key.startswith("net") and key[3:].isdigit() for key in opts)
    lines = [
        f"# derived by the dflash test bed from nodes/{node.node}/lxc/{vmid}.conf at start",
        f"lxc.uts.name = {opts.get('hostname', f'CT{vmid}')}",
        f"lxc.rootfs.path = overlay:{base}:{ct_dir / 'delta'}",
        # The bed's vmbr0: the node's own network (see the module's docstring).
        f"lxc.net.0.type = {'none' if shared_net else 'empty'}",
        "lxc.apparmor.profile = unconfined",
        # sysfs can only be mounted by the owner of the network namespace: one that shares the
        # node's gets the node's /sys bound instead.
        "lxc.mount.auto = proc:mixed cgroup:mixed" + ("" if shared_net else " sys:mixed"),
        "lxc.autodev = 1",
        f"lxc.cgroup.dir.monitor = {cgroup_name(node, vmid, 'monitor')}",
        f"lxc.cgroup.dir.container = {cgroup_name(node, vmid, 'payload')}",
        "lxc.pty.max = 64",
        "lxc.tty.max = 0",
        # minbase has no init; merged /usr means the target must be usr/sbin/... (TESTBED.md)
        f"lxc.mount.entry = {INIT_STATIC} usr/sbin/init.lxc none bind,ro,create=file 0 0",
        f"lxc.init.cmd = /usr/sbin/init.lxc -n {vmid} -- /bin/sleep infinity",
    ]
    if shared_net:
        lines.append("lxc.mount.entry = /sys sys none rbind,ro,create=dir 0 0")
    lines += memory_limit(node, vmid, opts, shared_net)
    if unpriv:
        lines += [f"lxc.idmap = u 0 {ID_SHIFT} 65536", f"lxc.idmap = g 0 {ID_SHIFT} 65536"]
    if opts.get("arch"):
        lines.append(f"lxc.arch = {opts['arch']}")
    rules = list(DEFAULT_DEVICE_RULES)
    for key in sorted(opts):
        if key.startswith("mp") and key[2:].isdigit():
            source, target, read_only = mount_source(node, key, opts[key], unpriv)
            flags = "rbind,create=dir" + (",ro" if read_only else "")
            lines.append(f"lxc.mount.entry = {source} {target.lstrip('/')} none {flags} 0 0")
        elif key.startswith("dev") and key[3:].isdigit():
            device = parse_property_string(opts[key], "path")
            path = device.get("path", "")
            kind, major, minor = device_number(path)
            rules.append(("allow", f"{kind} {major}:{minor} rw"))
            lines.append(f"lxc.mount.entry = {path} {path.lstrip('/')} none bind,create=file 0 0")
    raw = []
    for key, value in section.lxc:
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup2.devices.deny"):
            rules.append((key.rsplit(".", 1)[1], value))
        elif key.startswith("lxc.cgroup."):
            raw.append(f"# {key} = {value}  (cgroup v1 key: ignored, as on Proxmox VE 8)")
        elif key.startswith("lxc.cgroup2."):
            raw.append(f"# {key} = {value}  (not enforceable on this cgroup v1 host)")
        else:
            raw.append(f"{key} = {value}")
    # cgroup2 device rules, enforced here through the v1 devices controller (see above)
    lines += [f"lxc.cgroup.devices.{verb} = {rule}" for verb, rule in rules]
    return "\n".join(lines + raw) + "\n"


def _chown_tree_root(path: Path, unpriv: bool) -> None:
    owner = ID_SHIFT if unpriv else 0
    os.chown(path, owner, owner)


def prepare_volume(node: NodeConfig, volume: str, unpriv: bool) -> Path:
    """A storage volume's folder, created on first use with the container's root as owner."""
    folder = volume_folder(Path(node.root), volume)
    if not folder.exists():
        folder.mkdir(parents=True)
        _chown_tree_root(folder, unpriv)
    return folder


def _prepare_rootfs(node: NodeConfig, vmid: int, unpriv: bool) -> None:
    """The overlay's upper and work folders, owned by the container's root; a container whose
    privilege changed starts over from the base (its files have the other owners)."""
    ct_dir = node.lxcpath / str(vmid)
    marker = ct_dir / "owner"
    owner = str(ID_SHIFT if unpriv else 0)
    if marker.exists() and marker.read_text() != owner:
        shutil.rmtree(ct_dir / "delta", ignore_errors=True)
        shutil.rmtree(ct_dir / "work", ignore_errors=True)
    for name in ("delta", "work"):
        (ct_dir / name).mkdir(parents=True, exist_ok=True)
        _chown_tree_root(ct_dir / name, unpriv)
    marker.write_text(owner)


def debian_warning(node: NodeConfig, vmid: int, section: Section) -> str | None:
    """LXC/Setup/Debian.pm `new`: the warning for a Debian newer than the tested release."""
    if section.options.get("ostype", "debian") != "debian":
        return None
    relative = "etc/debian_version"
    upper = node.lxcpath / str(vmid) / "delta" / relative
    base = Path(node.shifted_rootfs if unprivileged(section) else node.base_rootfs) / relative
    try:
        text = (upper if upper.exists() else base).read_text().strip()
    except OSError:
        return None
    match = re.match(r"^(\d+)", text)
    if match and int(match[1]) >= DEBIAN_MAXIMUM_RELEASE + 1:
        return (
            f"The container's Debian version '{match[1]}' is newer than the tested version "
            f"'{DEBIAN_MAXIMUM_RELEASE}'. While everything may work fine, full compatibility "
            "cannot be guaranteed. Please check for PVE system updates."
        )
    return None


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def info(node: NodeConfig, vmid: int) -> tuple[str, int | None]:
    """('running' | 'stopped', init pid)."""
    if not (node.lxcpath / str(vmid) / "config").exists():
        return "stopped", None
    done = _run(["lxc-info", "-n", str(vmid), "-P", str(node.lxcpath), "-s", "-p"])
    fields = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    # A frozen container (a snapshot in progress) runs, for Proxmox: its init lives.
    state = fields.get("State", "").strip()
    if done.returncode != 0 or state not in ("RUNNING", "FREEZING", "FROZEN"):
        return "stopped", None
    pid = fields.get("PID", "").strip()
    return "running", int(pid) if pid.isdigit() else None


def start(node: NodeConfig, vmid: int, store: ConfigStore, log: TaskLog | None = None) -> None:
    """LXC.pm `vm_start`; warnings go to the task log (counted), as the prestart hook's do."""
    section = store.load(vmid).current
    ct_dir = node.lxcpath / str(vmid)
    _prepare_rootfs(node, vmid, unprivileged(section))
    config = derive_lxc_config(vmid, section, node)
    warning = debian_warning(node, vmid, section)
    if warning and log is not None:
        log.warn(warning)
    (ct_dir / "config").write_text(config)
    log_file = ct_dir / "start.log"
    done = _run(["lxc-start", "-n", str(vmid), "-P", str(node.lxcpath), "-d", "-o",
                 str(log_file), "-l", "ERROR"])  # fmt: skip
    if done.returncode != 0:
        detail = (done.stderr.strip() + "\n" + _tail(log_file)).strip()
        raise LxcError(f"{detail}\nstartup for container '{vmid}' failed")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state, pid = info(node, vmid)
        if state == "running":
            if pid:  # for `pct exec`'s quick check (NodeConfig.init_running)
                started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
                (ct_dir / "init").write_text(f"{pid} {started}\n")
            return
        time.sleep(0.05)
    raise LxcError(
        f"{_tail(log_file)}\nstartup for container '{vmid}' failed (not running after 10 s)"
    )


def stop(node: NodeConfig, vmid: int, timeout_s: int | None = None) -> None:
    """Hard stop (`pct stop`) by default; a clean shutdown with a timeout otherwise."""
    args = ["lxc-stop", "-n", str(vmid), "-P", str(node.lxcpath)]
    args += ["-k"] if timeout_s is None else ["-t", str(timeout_s)]
    done = _run(args, timeout=(timeout_s or 10) + 20)
    if done.returncode != 0 and info(node, vmid)[0] == "running":
        raise LxcError(done.stderr.strip() or f"lxc-stop failed for CT {vmid}")


def freeze(node: NodeConfig, vmid: int) -> None:
    """LXC.pm `freeze`: every process of the container stopped by its freezer cgroup."""
    done = _run(["lxc-freeze", "-n", str(vmid), "-P", str(node.lxcpath)])
    if done.returncode != 0:
        raise LxcError(done.stderr.strip() or f"unable to freeze CT {vmid}")


def thaw(node: NodeConfig, vmid: int) -> None:
    """LXC.pm `thaw`."""
    done = _run(["lxc-unfreeze", "-n", str(vmid), "-P", str(node.lxcpath)])
    if done.returncode != 0:
        raise LxcError(done.stderr.strip() or f"unable to thaw CT {vmid}")


# The new mount API (Linux 5.2+; mount_setattr 5.12+): one syscall number on every architecture.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH = 1, 0x1000, -100, 0x4
MOUNT_ATTR_RDONLY, CLONE_NEWNS = 0x1, 0x20000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]  # fmt: skip


def _check(result: int, what: str) -> int:
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
    return result


def _inject_mount(pid: int, key: str, source: str, target: str, read_only: bool,
                  owner: int) -> None:  # fmt: skip
    """In a child process: LXC.pm `mountpoint_stage` (a clone of a bind mount of the source,
    remounted read-only for `ro=1`, as `__bindmount_do`), then into the container's mount
    namespace, `walk_tree_nofollow_fd` (the target's missing folders made, owned by the
    container's root) and `mountpoint_insert_staged` (`move_mount`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC
    tree = _check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), flags),
                  f"open_tree() on {source}")  # fmt: skip
    if read_only:
        attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
        _check(libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr),
                            ctypes.sizeof(attr)), "bindmount error")  # fmt: skip
    namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    _check(libc.setns(namespace, CLONE_NEWNS), "failed to enter the container's mount namespace")
    os.chdir("/")
    # The bed's unprivileged root file system is an overlay that LXC mounts inside the
    # container's user namespace, where the node's uid 0 has no mapping (EOVERFLOW): the folders
    # are made as the container's root (fsuid), which gives the owner PVE's fchownat gives.
    libc.setfsgid(owner)
    libc.setfsuid(owner)
    path = "/"
    for part in [p for p in target.split("/") if p]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise OSError(0, f"symlink encountered at: {path}")
        if not os.path.isdir(path):
            try:
                os.mkdir(path, 0o755)
            except OSError as exc:
                raise OSError(exc.errno, f"failed to create path: {path}: {exc.strerror}") from None
    libc.setfsuid(0)
    libc.setfsgid(0)
    _check(libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(),
                        MOVE_MOUNT_F_EMPTY_PATH),
           f"failed to move '{key}' into container hierarchy")  # fmt: skip


def hotplug_mount(node: NodeConfig, vmid: int, key: str, value: str, section: Section) -> None:
    """LXC.pm `mountpoint_hotplug`: mount a new `mpN` into the running container (a bind mount
    or a storage volume, which here is a folder too). The work happens in a forked child, since
    a process with threads cannot change its mount namespace; its error comes back as LxcError."""
    state, pid = info(node, vmid)
    if state != "running" or not pid:
        raise LxcError(f"failed to open pidfd of container {vmid}'s init process")
    unpriv = unprivileged(section)
    source, target, read_only = mount_source(node, key, value, unpriv)
    if not os.path.isdir(source):  # LXC.pm `__mountpoint_mount`, a bind mount
        raise LxcError(f"directory '{source}' does not exist")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.close(read_end)
        code = 0
        try:
            _inject_mount(pid, key, source, target, read_only, ID_SHIFT if unpriv else 0)
        except BaseException as exc:  # everything goes back to the parent
            os.write(write_end, (exc.strerror if isinstance(exc, OSError) else str(exc)).encode())
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(child, 0)
    if status != 0:
        raise LxcError(message or f"mount point hotplug of {key} failed")


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""
