# Controller-side filter of verify.yml for the job's GPUs: the `gpu` finding, from what
# dflash_facts read of nvidia-smi on the target (module_utils/dflash_gpu.py judges it).
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_gpu import judge_facts


def _memory(used_mib: int | None) -> str:
    # Some drivers in containers list a process without its memory ([N/A]).
    return "memory not reported" if used_mib is None else f"{used_mib} MiB"


def _process(row: dict) -> str:
    return f"pid {row['pid']} ({row['name'] or 'no name'}, {_memory(row['used_mib'])})"


def gpu_findings(facts: dict) -> list[dict]:
    """`gpu`: a GPU of the layout missing or lost, a process on one that is not the job's,
    or memory on one held by no listed process."""
    view = judge_facts(facts)
    if not view["applies"]:
        return []
    out = [
        finding(
            "gpu",
            f"GPU {item['gpu']} of the layout",
            f"GPU {item['gpu']} {item['why']}",
            "check the container's GPU entries (pct config) and the node's kernel log for "
            "Xid 79 (fallen off the bus); a lost GPU needs the node rebooted",
            gpu=item["gpu"],
        )
        for item in view["missing"]
    ]
    for row in view["foreign"]:
        where = "" if row["visible"] else " (not in this target's pid namespace: the node's pid)"
        out.append(
            finding(
                "gpu",
                f"only this job's processes on GPU {row['gpu']}",
                f"pid {row['pid']}{where} ({row['command']}) holds {_memory(row['used_mib'])}",
                "stop it or move it off this job's GPUs (another root's trainer: its stop.yml); "
                "it takes the job's memory and slows it",
                pid=row["pid"],
                gpu=row["gpu"],
                used_mib=row["used_mib"],
                command=row["command"],
            )
        )
    for item in view["crowded"]:
        listed = ", ".join(_process(row) for row in item["processes"])
        out.append(
            finding(
                "gpu",
                f"one process on GPU {item['gpu']}: this job's rank",
                f"{len(item['processes'])} processes: {listed}; the pids are the node's (this "
                "driver does not translate pid namespaces)",
                "find the one that is not this job's with nvidia-smi on the node, and stop it",
                gpu=item["gpu"],
                pids=[row["pid"] for row in item["processes"]],
            )
        )
    for item in view["unowned"]:
        out.append(
            finding(
                "gpu",
                f"GPU {item['gpu']}'s memory held by its processes",
                f"{item['used_mib']} MiB in use, {item['listed_mib']} MiB by listed processes",
                "memory held by no live process (a crashed job's context): stop what still holds "
                "the GPU, or reset it once idle (nvidia-smi -r on the node)",
                gpu=item["gpu"],
                used_mib=item["used_mib"],
                listed_mib=item["listed_mib"],
            )
        )
    return out


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_gpu_findings": gpu_findings}
