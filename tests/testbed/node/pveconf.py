"""Proxmox container configs (`/etc/pve/nodes/<node>/lxc/<vmid>.conf`): parse and write.

The format, as Proxmox writes it (pve-container src/PVE/LXC/Config.pm `parse_pct_config`,
`write_pct_config`): `#` lines first (the description), then `key: value` lines with unique keys
in sorted order, then raw `lxc.*` lines (repeatable, order kept); changes not yet applied follow
in a `[pve:pending]` section (with `delete: key,...` for pending removals); each snapshot follows
as a `[name]` section holding a copy of the config at that time plus `snaptime`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

# Keys whose values the API returns as integers (the rest are strings).
INT_KEYS = frozenset(
    {
        "memory",
        "swap",
        "cores",
        "cpuunits",
        "onboot",
        "unprivileged",
        "protection",
        "template",
        "tty",
        "snaptime",
        "console",
    }
)


@dataclass
class Section:
    """One config: the current one or a snapshot's."""

    options: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] = field(default_factory=list)
    description: str = ""

    def copy(self) -> Section:
        return Section(dict(self.options), list(self.lxc), self.description)

    def to_api(self) -> dict[str, object]:
        """The shape `GET .../config` returns: typed values, `lxc` as [key, value] pairs."""
        data: dict[str, object] = {}
        for key, value in self.options.items():
            data[key] = int(value) if key in INT_KEYS and value.lstrip("-").isdigit() else value
        if self.description:
            data["description"] = self.description
        if self.lxc:
            data["lxc"] = [[k, v] for k, v in self.lxc]
        return data


@dataclass
class CtConfig:
    current: Section = field(default_factory=Section)
    snapshots: dict[str, Section] = field(default_factory=dict)
    pending: Section = field(default_factory=Section)

    def pending_delete(self) -> list[str]:
        return [k for k in self.pending.options.get("delete", "").split(",") if k]

    def with_pending(self) -> Section:
        """What `GET .../config` returns without `current=1`: pending values merged in
        (pve-guest-common src/PVE/AbstractConfig.pm `load_current_config`)."""
        merged = self.current.copy()
        merged.options.update({k: v for k, v in self.pending.options.items() if k != "delete"})
        for key in self.pending_delete():
            merged.options.pop(key, None)
        return merged

    def pending_array(self) -> list[dict[str, object]]:
        """`GET .../pending` (pve-guest-common src/PVE/GuestHelpers.pm
        `config_with_pending_array`): one item per key, with `pending` and `delete` marks."""
        pending = {k: v for k, v in self.pending.options.items() if k != "delete"}
        deleted = set(self.pending_delete())
        items: list[dict[str, object]] = []
        for key, value in self.current.options.items():
            item: dict[str, object] = {"key": key, "value": value}
            if key in pending:
                item["pending"] = pending.pop(key)
            if key in deleted:
                item["delete"] = 1
                deleted.discard(key)
            items.append(item)
        items += [{"key": key, "pending": value} for key, value in pending.items()]
        items += [{"key": key, "delete": 1} for key in sorted(deleted)]
        return items


def parse(text: str) -> CtConfig:
    conf = CtConfig()
    section = conf.current
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            continue
        if line.lower() == "[pve:pending]":
            section = conf.pending
        elif line.startswith("[") and line.endswith("]"):
            section = conf.snapshots.setdefault(line[1:-1], Section())
        elif line.startswith("#"):
            # Proxmox stores the description url-encoded, one `#` line per line
            text_line = unquote(line[1:])
            section.description += ("\n" if section.description else "") + text_line
        else:
            key, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"unable to parse config line: {line!r}")
            key, value = key.strip(), value.strip()
            if key.startswith("lxc."):
                section.lxc.append((key, value))
            else:
                section.options[key] = value
    return conf


def _format_section(section: Section) -> str:
    lines = [f"#{quote(part, safe=' /:,=.-_()')}" for part in section.description.splitlines()]
    lines += [f"{key}: {section.options[key]}" for key in sorted(section.options)]
    lines += [f"{key}: {value}" for key, value in section.lxc]
    return "".join(line + "\n" for line in lines)


def format_config(conf: CtConfig) -> str:
    out = _format_section(conf.current)
    if conf.pending.options:
        out += "\n[pve:pending]\n" + _format_section(conf.pending)
    for name in sorted(conf.snapshots):
        out += f"\n[{name}]\n" + _format_section(conf.snapshots[name])
    return out


def digest(text: str) -> str:
    """Proxmox returns the SHA1 of the file as `digest` (for optimistic locking)."""
    return hashlib.sha1(text.encode()).hexdigest()


class ConfigStore:
    """The `nodes/<node>/lxc` folder of one node, with Proxmox's wording for a missing file."""

    def __init__(self, etc_pve: Path, node: str) -> None:
        self.etc_pve = etc_pve
        self.node = node
        self.folder = etc_pve / "nodes" / node / "lxc"
        self.lock_folder = etc_pve.parent / "lock"

    def path(self, vmid: int) -> Path:
        return self.folder / f"{vmid}.conf"

    def missing_message(self, vmid: int) -> str:
        # the same words as NodeConfig.missing_message (Proxmox's)
        return f"Configuration file 'nodes/{self.node}/lxc/{vmid}.conf' does not exist"

    def exists(self, vmid: int) -> bool:
        return self.path(vmid).is_file()

    def vmids(self) -> list[int]:
        return sorted(int(p.stem) for p in self.folder.glob("*.conf") if p.stem.isdigit())

    def read_text(self, vmid: int) -> str:
        try:
            return self.path(vmid).read_text()
        except FileNotFoundError:
            raise ConfigMissing(self.missing_message(vmid)) from None

    def digest_of(self, vmid: int) -> str:
        return digest(self.read_text(vmid))

    def load(self, vmid: int) -> CtConfig:
        return parse(self.read_text(vmid))

    def write(self, vmid: int, conf: CtConfig) -> None:
        target = self.path(vmid)
        tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}")
        tmp.write_text(format_config(conf))
        tmp.replace(target)  # readers never see a half-written config

    @contextmanager
    def locked(self, vmid: int) -> Iterator[None]:
        """Serialise read-modify-write of one config, like Proxmox's per-guest config lock."""
        self.lock_folder.mkdir(parents=True, exist_ok=True)
        with (self.lock_folder / f"pve-config-{vmid}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


class ConfigMissing(LookupError):
    """The guest has no config on this node; the message is Proxmox's."""


def parse_property_string(value: str, default_key: str) -> dict[str, str]:
    """`/src,mp=/dst,ro=1` -> {default_key: '/src', 'mp': '/dst', 'ro': '1'}."""
    result: dict[str, str] = {}
    for index, part in enumerate(value.split(",")):
        key, sep, val = part.partition("=")
        if sep:
            result[key.strip()] = val.strip()
        elif index == 0:
            result[default_key] = part.strip()
        else:
            raise ValueError(f"unable to parse property string {value!r}")
    return result
