# The memory cgroup of the host or container the toolkit runs in: how many processes the
# kernel OOM-killed in it, and its limit. Inside a Proxmox VE 8 container (cgroup v2, its own
# cgroup namespace) /sys/fs/cgroup is the container's cgroup; on cgroup v1 hosts the memory
# controller's folder. Standard library only.
from __future__ import annotations

# (file, the key of its OOM-kill counter): cgroup v2 first, then v1 (kernel 4.13+).
OOM_COUNTERS = (
    ("/sys/fs/cgroup/memory.events", "oom_kill"),
    ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
)
LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
UNLIMITED_BYTES = 1 << 60  # v1 writes "no limit" as a page-aligned 2**63-1


def _counter(path: str, key: str) -> int | None:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return None


def oom_kills() -> int | None:
    """Processes the kernel OOM-killed in this cgroup since it was made (None: not readable)."""
    for path, key in OOM_COUNTERS:
        found = _counter(path, key)
        if found is not None:
            return found
    return None


def memory_limit_mb() -> int | None:
    """The cgroup's memory limit in MB (None: no limit, or not readable)."""
    for path in LIMITS:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED_BYTES:
            return int(text) // (1024 * 1024)
        return None
    return None


def memory_facts() -> dict:
    return {"oom_kills": oom_kills(), "limit_mb": memory_limit_mb()}
