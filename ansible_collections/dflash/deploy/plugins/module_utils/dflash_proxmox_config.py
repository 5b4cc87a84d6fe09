# What a Proxmox container config (as `GET .../config?current=1` returns it) says about GPUs,
# mount points and snapshots. Pure functions: every message names the container, the config
# line and the fix.
from __future__ import annotations

import re
from typing import Any

# The NVIDIA driver's device nodes: (path, what, device name in /proc/devices, minor). The
# GPUs and nvidiactl belong to the `nvidia` major (195 by the driver's choice), nvidia-uvm to
# a major the kernel hands out when its module loads: both are read from the node.
CTL = ("/dev/nvidiactl", "the NVIDIA control device", "nvidia", 255)
UVM = ("/dev/nvidia-uvm", "the NVIDIA UVM device", "nvidia-uvm", 0)


def property_string(value: str, first: str) -> dict[str, str]:
    """`/src,mp=/dst,ro=1` -> {first: '/src', 'mp': '/dst', 'ro': '1'}."""
    result: dict[str, str] = {}
    for index, part in enumerate(str(value).split(",")):
        key, sep, val = part.partition("=")
        if sep:
            result[key.strip()] = val.strip()
        elif index == 0:
            result[first] = part.strip()
    return result


def lxc_entries(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Raw `lxc.*` lines: the API returns them as [key, value] pairs under `lxc`."""
    return [(str(k), str(v)) for k, v in config.get("lxc") or []]


def numbered(config: dict[str, Any], prefix: str) -> list[str]:
    return sorted(
        (k for k in config if re.fullmatch(rf"{prefix}\d+", k)), key=lambda k: int(k[len(prefix) :])
    )


def next_index(config: dict[str, Any], prefix: str) -> int:
    return max((int(k[len(prefix) :]) for k in numbered(config, prefix)), default=-1) + 1


def char_majors(proc_devices: str) -> dict[str, int]:
    """Character device name -> major, from the node kernel's /proc/devices."""
    majors: dict[str, int] = {}
    section = ""
    for line in proc_devices.splitlines():
        if line.endswith("devices:"):
            section = line
        elif section.startswith("Character") and (match := re.fullmatch(r"\s*(\d+)\s+(\S+)", line)):
            majors.setdefault(match[2], int(match[1]))
    if "nvidia" not in majors and "nvidia-frontend" in majors:
        majors["nvidia"] = majors["nvidia-frontend"]
    return majors


# --- devices -------------------------------------------------------------------------------
def passed_devices(config: dict[str, Any]) -> dict[str, str]:
    """Device path -> the config line that passes it (`devN` or an `lxc.mount.entry`)."""
    devices: dict[str, str] = {}
    for key in numbered(config, "dev"):
        devices[property_string(config[key], "path").get("path", "")] = f"{key}: {config[key]}"
    for key, value in lxc_entries(config):
        source = value.split()[0] if value.split() else ""
        if key == "lxc.mount.entry" and source.startswith("/dev/"):
            devices.setdefault(source, f"{key}: {value}")
    return devices


def _rule_allows(rule: str, major: int, minor: int) -> bool:
    """A `c MAJ:MIN rwm` / `a` device rule lets the container read and write char device M:m."""
    if rule.strip() == "a":
        return True
    match = re.fullmatch(r"c\s+(\*|\d+):(\*|\d+)\s+([rwm]+)", rule.strip())
    return bool(
        match
        and match[1] in ("*", str(major))
        and match[2] in ("*", str(minor))
        and {"r", "w"} <= set(match[3])
    )


def gpu_problems(
    config: dict[str, Any],
    pending: dict[str, Any],
    vmid: int,
    gpus: list[int],
    majors: dict[str, int] | None,
) -> list[str]:
    """What keeps the running container from using the GPUs. Device rules are checked (cgroup
    v2 only: Proxmox VE 8 ignores `lxc.cgroup.*`) when `majors` (the node's /proc/devices)
    is known; devN entries need none (Proxmox adds the rule)."""
    if not gpus:
        return []
    wanted = [(f"/dev/nvidia{k}", f"GPU {k}", "nvidia", k) for k in gpus] + [CTL, UVM]
    devices, later = passed_devices(config), passed_devices(pending)
    rules = [v for k, v in lxc_entries(config) if k == "lxc.cgroup2.devices.allow"]
    v1_rules = [v for k, v in lxc_entries(config) if k == "lxc.cgroup.devices.allow"]
    problems, next_dev = [], next_index({**config, **pending}, "dev")
    for path, what, name, minor in wanted:
        line = devices.get(path)
        if line is None and path in later:
            problems.append(
                f"{what} ({path}) is passed to container {vmid} only as a pending change "
                f"('{later[path]}', set while it runs): the running container does not have "
                f"it; restart the container (pct reboot {vmid}) to apply it"
            )
        elif line is None:
            problems.append(
                f"{what} ({path}) is not passed through to container {vmid}; add "
                f"'dev{next_dev}: {path}' to its config (pct set {vmid} -dev{next_dev} {path})"
            )
            next_dev += 1
        elif line.startswith("lxc.") and majors is not None:
            problems += _rule_problems(vmid, what, path, name, minor, line, rules, v1_rules, majors)
    return problems


def _rule_problems(
    vmid: int,
    what: str,
    path: str,
    name: str,
    minor: int,
    line: str,
    rules: list[str],
    v1_rules: list[str],
    majors: dict[str, int],
) -> list[str]:
    major = majors.get(name)
    if major is None:
        return [
            f"{what} ({path}) is mounted into container {vmid} ('{line}') but the node's "
            f"kernel has no '{name}' device (not in /proc/devices): load the NVIDIA driver "
            "on the node (nvidia-modprobe -u -c=0 for nvidia-uvm)"
        ]
    if any(_rule_allows(rule, major, minor) for rule in rules):
        return []
    fix = f"'lxc.cgroup2.devices.allow: c {major}:* rwm' to /etc/pve/lxc/{vmid}.conf"
    ignored = [rule for rule in v1_rules if _rule_allows(rule, major, minor)]
    if ignored:
        return [
            f"{what} ({path}) is mounted into container {vmid} ('{line}') and allowed only by "
            f"'lxc.cgroup.devices.allow: {ignored[0]}', a cgroup v1 key that Proxmox VE 8 "
            f"(cgroup v2) ignores; add {fix}"
        ]
    return [
        f"{what} ({path}, char {major}:{minor} on this node) is mounted into container {vmid} "
        f"('{line}') but no cgroup2 rule allows it; add {fix}"
    ]


# --- mount points ----------------------------------------------------------------------------
def mount_points(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Container path -> {key, source, read_only} for every mpN (and lxc bind mount)."""
    found: dict[str, dict[str, Any]] = {}
    for key in numbered(config, "mp"):
        mount = property_string(config[key], "volume")
        if mount.get("mp"):
            found[mount["mp"].rstrip("/") or "/"] = {
                "key": key,
                "source": mount.get("volume", ""),
                "read_only": mount.get("ro") in ("1", "true", "yes", "on"),
            }
    for key, value in lxc_entries(config):
        words = value.split()
        if key == "lxc.mount.entry" and len(words) >= 4 and "bind" in words[3]:
            found.setdefault(
                "/" + words[1].strip("/"),
                {
                    "key": key,
                    "source": words[0],
                    "read_only": "ro" in words[3].split(","),
                },
            )
    return found


def mount_problems(
    config: dict[str, Any], pending: dict[str, Any], vmid: int, mounts: list[dict[str, Any]]
) -> list[str]:
    found, later = mount_points(config), mount_points(pending)
    problems, next_mp = [], next_index({**config, **pending}, "mp")
    for wanted in mounts:
        path = "/" + wanted["path"].strip("/")
        have, source = found.get(path), wanted.get("source")
        if have is None and path in later:
            problems.append(
                f"mount point {path} of container {vmid} is only a pending change "
                f"({later[path]['key']}: {pending[later[path]['key']]}, set while it runs); "
                f"restart the container (pct reboot {vmid}) to apply it"
            )
        elif have is None:
            example = source or "/path/on/node"
            problems.append(
                f"container {vmid} has no mount point at {path}; add one, e.g. "
                f"'mp{next_mp}: {example},mp={path}' (pct set {vmid} -mp{next_mp} "
                f"{example},mp={path})"
            )
            next_mp += 1
        elif source and have["source"].rstrip("/") != source.rstrip("/"):
            problems.append(
                f"mount point {path} of container {vmid} comes from {have['source']} "
                f"({have['key']}), expected {source}"
            )
    return problems


# --- snapshots -------------------------------------------------------------------------------
def snapshot_blockers(config: dict[str, Any], vmid: int) -> str:
    """Why Proxmox refuses to snapshot this container ("snapshot feature is not available"):
    pve-container LXC/Config.pm `has_feature` needs every volume (rootfs, mpN) on a storage
    with snapshots, and a bind or device mount point is none."""
    for key in numbered(config, "mp"):
        volume = property_string(config[key], "volume").get("volume", "")
        if volume.startswith("/"):
            kind = "a device" if volume.startswith("/dev/") else "a bind"
            target = property_string(config[key], "volume").get("mp", "")
            return (
                f"mount point {key} ({config[key]}) is {kind} mount, and Proxmox snapshots no "
                f"container with bind or device mount points; put {target} on a storage-backed "
                f"volume instead (e.g. pct set {vmid} -{key} local-lvm:8,mp={target}, then fill "
                "it; for the wheelhouse an index_url lock source also does), or take no "
                "snapshot: dflash_proxmox_snapshot: {}"
            )
    volumes = [
        f"{k} on {property_string(config[k], 'volume').get('volume', '').split(':')[0]}"
        for k in ["rootfs", *numbered(config, "mp")]
        if k in config
    ]
    return (
        f"a volume of container {vmid} ({', '.join(volumes)}) is on a storage without "
        "snapshots (a dir, NFS or CIFS storage has them only for qcow2 images; LVM-thin, "
        f"ZFS, Ceph RBD and BTRFS have them); move it (pct move-volume {vmid} rootfs "
        "local-lvm), or take no snapshot: dflash_proxmox_snapshot: {}"
    )


def summarize(config: dict[str, Any], gpus: list[int]) -> dict[str, Any]:
    devices = passed_devices(config)
    indexes = [int(m[1]) for d in devices if (m := re.fullmatch(r"/dev/nvidia(\d+)", d))]
    return {
        "hostname": config.get("hostname"),
        "arch": config.get("arch"),
        "memory": config.get("memory"),
        "cores": config.get("cores"),
        "unprivileged": bool(int(config.get("unprivileged") or 0)),
        "rootfs": config.get("rootfs"),
        "gpus": {
            str(k): devices[f"/dev/nvidia{k}"]
            for k in sorted({*gpus, *indexes})
            if f"/dev/nvidia{k}" in devices
        },
        "devices": sorted(devices),
        "mounts": mount_points(config),
    }
