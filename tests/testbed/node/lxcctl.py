"""Real LXC under the doubles: derive each LXC config from its Proxmox config, start, stop, query.

Differences from Proxmox, on purpose: containers are privileged; `netN` is ignored (the network
is `empty`: everything reaches a container through `pct exec`); memory/cores are recorded but not
enforced; `devN` becomes an optional bind mount of the node's device (Proxmox creates the node
itself), so a config naming GPUs the node lacks still starts; storage volumes are emulated by one
overlay per container on a shared base tree.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .nodecfg import NodeConfig
from .pveconf import ConfigStore, Section, parse_property_string

INIT_STATIC = "/usr/sbin/init.lxc.static"


class LxcError(RuntimeError):
    pass


def derive_lxc_config(vmid: int, section: Section, node: NodeConfig) -> str:
    ct_dir = node.lxcpath / str(vmid)
    opts = section.options
    lines = [
        f"# derived by the dflash test bed from nodes/{node.node}/lxc/{vmid}.conf at start",
        f"lxc.uts.name = {opts.get('hostname', f'CT{vmid}')}",
        f"lxc.rootfs.path = overlay:{node.base_rootfs}:{ct_dir / 'delta'}",
        "lxc.net.0.type = empty",
        "lxc.apparmor.profile = unconfined",
        "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        "lxc.autodev = 1",
        "lxc.pty.max = 64",
        "lxc.tty.max = 0",
        # minbase has no init; merged /usr means the target must be usr/sbin/... (TESTBED.md)
        f"lxc.mount.entry = {INIT_STATIC} usr/sbin/init.lxc none bind,ro,create=file 0 0",
        f"lxc.init.cmd = /usr/sbin/init.lxc -n {vmid} -- /bin/sleep infinity",
    ]
    if opts.get("arch"):
        lines.append(f"lxc.arch = {opts['arch']}")
    for key in sorted(opts):
        if key.startswith("mp") and key[2:].isdigit():
            mount = parse_property_string(opts[key], "volume")
            source, target = mount["volume"], mount.get("mp", "")
            if not source.startswith("/") or not target.startswith("/"):
                raise LxcError(
                    f"{key}: only bind mount points (absolute node path, mp=/path) are emulated "
                    f"by the test bed, got {opts[key]!r}"
                )
            flags = "rbind,create=dir" + (",ro" if mount.get("ro") == "1" else "")
            lines.append(f"lxc.mount.entry = {source} {target.lstrip('/')} none {flags} 0 0")
        elif key.startswith("dev") and key[3:].isdigit():
            path = parse_property_string(opts[key], "path").get("path", "")
            if Path(path).exists():
                lines.append(
                    f"lxc.mount.entry = {path} {path.lstrip('/')} none bind,create=file 0 0"
                )
            else:  # no such device on this node: leave /dev/... absent rather than a plain file
                lines.append(f"# {key}: {path} does not exist on this node, not passed through")
    # Raw lxc.* keys go through unchanged, as Proxmox does.
    lines += [f"{key} = {value}" for key, value in section.lxc]
    return "\n".join(lines) + "\n"


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def info(node: NodeConfig, vmid: int) -> tuple[str, int | None]:
    """('running' | 'stopped', init pid)."""
    if not (node.lxcpath / str(vmid) / "config").exists():
        return "stopped", None
    done = _run(["lxc-info", "-n", str(vmid), "-P", str(node.lxcpath), "-s", "-p"])
    fields = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    if done.returncode != 0 or fields.get("State", "").strip() != "RUNNING":
        return "stopped", None
    pid = fields.get("PID", "").strip()
    return "running", int(pid) if pid.isdigit() else None


def start(node: NodeConfig, vmid: int, store: ConfigStore) -> None:
    section = store.load(vmid).current
    ct_dir = node.lxcpath / str(vmid)
    (ct_dir / "delta").mkdir(parents=True, exist_ok=True)
    (ct_dir / "config").write_text(derive_lxc_config(vmid, section, node))
    log = ct_dir / "start.log"
    done = _run(
        ["lxc-start", "-n", str(vmid), "-P", str(node.lxcpath), "-d", "-o", str(log), "-l", "ERROR"]
    )
    if done.returncode != 0:
        detail = (done.stderr.strip() + "\n" + _tail(log)).strip()
        raise LxcError(f"{detail}\nstartup for container '{vmid}' failed")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if info(node, vmid)[0] == "running":
            return
        time.sleep(0.05)
    raise LxcError(f"{_tail(log)}\nstartup for container '{vmid}' failed (not running after 10 s)")


def stop(node: NodeConfig, vmid: int, timeout_s: int | None = None) -> None:
    """Hard stop (`pct stop`) by default; a clean shutdown with a timeout otherwise."""
    args = ["lxc-stop", "-n", str(vmid), "-P", str(node.lxcpath)]
    args += ["-k"] if timeout_s is None else ["-t", str(timeout_s)]
    done = _run(args, timeout=(timeout_s or 10) + 20)
    if done.returncode != 0 and info(node, vmid)[0] == "running":
        raise LxcError(done.stderr.strip() or f"lxc-stop failed for CT {vmid}")


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""
