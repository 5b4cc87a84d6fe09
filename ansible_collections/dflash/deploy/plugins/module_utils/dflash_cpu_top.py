# Who takes the CPU on a target: every process's CPU time over a short sample through /proc,
# the trainer's own processes and this reader's chain of parents left out, for verify's
# `contention` finding. Inside a container /proc shows the container's processes only.
from __future__ import annotations

import os
import time

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_procs import ancestors

SAMPLE_S = 1.0  # long enough for a busy process to show, short beside a verify run
SHOWN = 5  # the top consumers named
NOTICED = 0.05  # of one CPU: less is the noise of idle daemons


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """A process's name, parent, start time and CPU ticks (user + system), or None once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    name = raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode(errors="replace")
    fields = raw.rsplit(b")", 1)[1].split()
    return name, int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12])


def _snapshot() -> dict[int, tuple[str, int, int, int]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                found[int(entry)] = stat
    return found


def _below(roots: set[int], parents: dict[int, int]) -> set[int]:
    """`roots` and every process under them."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            text = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= 120 else text[:117] + "..."


def cpu_consumers(trainer_pids: set[int], seconds: float = SAMPLE_S) -> dict:
    """The processes that took the most CPU over `seconds`, as shares of one CPU, newest
    figures first: the trainers' processes, what runs under them and this reader's own chain
    (sshd or the controller) left out; also the sum of all of them and the CPUs there are."""
    before = _snapshot()
    began = time.monotonic()
    time.sleep(seconds)
    after = _snapshot()
    elapsed = time.monotonic() - began
    ticks = os.sysconf("SC_CLK_TCK")
    parents = {pid: stat[1] for pid, stat in after.items()}
    skip = _below(trainer_pids, parents) | ancestors()
    rows, total = [], 0.0
    for pid, (name, _, started, used) in after.items():
        if pid in skip:
            continue
        earlier = before.get(pid)
        # A process born during the sample (or a reused pid) counts from zero.
        since = earlier[3] if earlier and earlier[2] == started else 0
        share = (used - since) / ticks / elapsed
        total += share
        if share >= NOTICED:
            rows.append({"pid": pid, "name": name, "cpu": round(share, 2)})
    rows.sort(key=lambda row: -row["cpu"])
    for row in rows[:SHOWN]:
        row["cmdline"] = _cmdline(row["pid"])
    return {
        "seconds": round(elapsed, 2),
        "cpus": len(os.sched_getaffinity(0)),
        "others_cpu": round(total, 2),
        "top": rows[:SHOWN],
    }
