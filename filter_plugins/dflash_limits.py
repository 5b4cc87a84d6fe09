# The container's Proxmox limits (memory, cores; read by the dflash_proxmox check) against the
# trainer processes the deploy will start there: a layout the limits cannot hold is named before
# anything changes, instead of the kernel OOM-killing the trainer hours in.
from __future__ import annotations

DOCUMENTATION = r"""
name: dflash_limits_problems
short_description: What the container's memory limit cannot hold of this layout
description:
  - Given the dflash_proxmox check's result and the validated run spec (its C(layout) and
    trainer flags), a message when the trainer's processes need more memory than the
    container may use, with the numbers and the fix; an empty list when they fit or nothing
    is known. (C(dflash_limits_warnings), in the same file, says when they outnumber its
    cores.)
  - The processes are one per GPU of the layout (target and drafter GPUs together), or the
    C(cpu_ranks) trainer flag's ranks on the CPU, else one.
  - Checked only with O(per_process_mb) (C(dflash_trainer_memory_mb)) above 0.
positional: per_process_mb
options:
  _input:
    description: C(dflash_proxmox_result) (its C(config) with C(memory) in MB and C(cores)).
    type: dict
    required: true
  spec:
    description: The run spec (C(dflash_run_spec)'s result).
    type: dict
    required: true
  per_process_mb:
    description: Memory each trainer process needs, in MB; 0 checks the cores only.
    type: int
    default: 0
"""

RETURN = r"""
_value:
  description: The problems, each a sentence with the numbers and the fix.
  type: list
  elements: str
"""


def trainer_processes(spec: dict) -> int:
    layout = spec.get("layout") or {}
    gpus = set(layout.get("target") or []) | set(layout.get("drafter") or [])
    if gpus:
        return len(gpus)
    for group in spec.get("flags") or []:
        if group[0] == "--cpu-ranks" and len(group) > 1 and str(group[1]).isdigit():
            return int(group[1])
    return 1


def limits_problems(proxmox: dict | None, spec: dict, per_process_mb: int = 0) -> list[str]:
    """Over the memory limit: the kernel would OOM-kill the trainer."""
    config = (proxmox or {}).get("config") or {}
    vmid = (proxmox or {}).get("vmid")
    processes = trainer_processes(spec)
    problems = []
    memory = config.get("memory")
    if per_process_mb and memory and processes * per_process_mb > int(memory):
        problems.append(
            f"container {vmid} may use {memory} MB of memory (memory in its Proxmox config), and "
            f"this layout runs {processes} trainer process(es) of {per_process_mb} MB each "
            f"(dflash_trainer_memory_mb): {processes * per_process_mb} MB, which the kernel "
            f"would answer by OOM-killing the trainer. Raise the limit (pct set {vmid} -memory "
            f"{processes * per_process_mb}), or run fewer processes"
        )
    return problems


def limits_warnings(proxmox: dict | None, spec: dict) -> list[str]:
    """Over the core limit: the processes run, slower (a warning, never a refusal)."""
    config = (proxmox or {}).get("config") or {}
    vmid, cores = (proxmox or {}).get("vmid"), config.get("cores")
    processes = trainer_processes(spec)
    if not cores or processes <= int(cores):
        return []
    return [
        f"container {vmid} may use {cores} core(s) (cores in its Proxmox config), and this "
        f"layout runs {processes} trainer processes: they share the cores and train slower "
        f"(pct set {vmid} -cores {processes} gives each its own)"
    ]


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_limits_problems": limits_problems,
            "dflash_limits_warnings": limits_warnings,
        }
