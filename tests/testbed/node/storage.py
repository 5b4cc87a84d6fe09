"""The node's storages (`/etc/pve/storage.cfg`) and which volumes can be snapshotted.

Proxmox decides whether a container can be snapshotted volume by volume (pve-container
src/PVE/LXC/Config.pm `has_feature`: the rootfs and every mpN): a bind or device mount point (an
absolute path) never can (pve-storage src/PVE/Storage.pm `volume_has_feature` returns undef for a
path), a storage volume can when its plugin's `volume_has_feature` table says so for the
volume's format. The table below is those plugins' `snapshot => {current => ...}` entries
(src/PVE/Storage/{ZFSPool,LvmThin,RBD,BTRFS,LVM}Plugin.pm and the default in Plugin.pm, which
dir, NFS and CIFS storages use). The bed keeps each volume as a folder under `<bed>/volumes/`.
"""

from __future__ import annotations

import re
from pathlib import Path

# The storages of a fresh single-node install (dir `local` and LVM-thin `local-lvm`) plus a ZFS
# pool, as `pvesm` writes them (SectionConfig: `type: id`, then tab-indented options).
DEFAULT_STORAGE_CFG = """dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup,rootdir

lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images

zfspool: local-zfs
\tpool rpool/data
\tsparse 1
\tcontent images,rootdir
"""

# Storage type -> volume formats that can be snapshotted (`snapshot => {current => ...}`).
ANY = frozenset({"raw", "subvol", "qcow2", "vmdk"})
SNAPSHOT_FORMATS: dict[str, frozenset[str]] = {
    "zfspool": ANY,
    "lvmthin": ANY,
    "rbd": ANY,
    "btrfs": frozenset({"raw", "subvol", "qcow2"}),
    "lvm": frozenset(),
    "dir": frozenset({"qcow2"}),
    "nfs": frozenset({"qcow2"}),
    "cifs": frozenset({"qcow2"}),
}


def parse_storage_cfg(text: str) -> dict[str, dict[str, str]]:
    """storage id -> {'type': ..., option: value}."""
    storages: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            kind, _, storeid = line.partition(":")
            current = storages.setdefault(storeid.strip(), {"type": kind.strip()})
        elif current is not None:
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return storages


def volume_format(storage_type: str, volname: str) -> str:
    """The format part of pve-storage's `parse_volname`: LVM and RBD images are raw, ZFS
    `subvol-*` are subvols, file storages tell it by the extension."""
    if storage_type in ("dir", "nfs", "cifs", "btrfs"):
        match = re.search(r"\.(raw|qcow2|vmdk|subvol)$", volname)
        return match[1] if match else "raw"
    return "subvol" if volname.startswith("subvol-") else "raw"


def snapshot_capable(storages: dict[str, dict[str, str]], volume: str) -> bool:
    """`volume_has_feature(..., 'snapshot', volume)` for a mount point's volume."""
    if volume.startswith("/"):
        return False  # a bind or device mount point
    storeid, _, volname = volume.partition(":")
    storage = storages.get(storeid)
    if storage is None:
        return False
    return volume_format(storage["type"], volname) in SNAPSHOT_FORMATS.get(storage["type"], ())


def volume_folder(bed_root: Path, volume: str) -> Path:
    """Where the bed keeps a storage volume's files (a folder per volume)."""
    storeid, _, volname = volume.partition(":")
    return bed_root / "volumes" / storeid / volname.replace("/", "_")
