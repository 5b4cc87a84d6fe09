"""GPU roles: parse --target-gpus / --drafter-gpus and decide how the work is laid out.

Modes: "cpu" (both empty), "colocated" (equal lists: each rank runs target and drafter),
"split" (disjoint lists: target ranks stream features to drafter ranks). Part 1 runs one
process: the CPU, or one GPU colocated. Part 2 adds torchrun ranks; the roles stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash.errors import ConfigError


def parse_gpu_list(flag: str, text: str) -> list[int]:
    """Parse "0-4", "5,6,7", "0-2,5" or "" (no GPU) into a list of distinct indices."""
    hint = "use a list like 5,6,7 or a range like 5-7"
    if not text.strip():
        return []
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ConfigError(f"{flag} '{text}': not an integer range; {hint}") from None
        if first < 0 or last < first:
            raise ConfigError(f"{flag} '{text}': '{part}' is not an ascending range; {hint}")
        ids.extend(range(first, last + 1))
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{flag} '{text}': a GPU is listed twice")
    return ids


@dataclass(frozen=True)
class Roles:
    target: list[int]
    drafter: list[int]

    @property
    def mode(self) -> str:
        if not self.target:
            return "cpu"
        return "colocated" if self.target == self.drafter else "split"

    def as_dict(self) -> dict[str, list[int]]:
        return {"target": list(self.target), "drafter": list(self.drafter)}


def resolve_roles(target_text: str, drafter_text: str) -> Roles:
    """Validate the two GPU lists against each other and against this machine."""
    target = parse_gpu_list("--target-gpus", target_text)
    drafter = parse_gpu_list("--drafter-gpus", drafter_text)
    if bool(target) != bool(drafter):
        raise ConfigError(
            f"--target-gpus '{target_text}' and --drafter-gpus '{drafter_text}': give both "
            "(GPU mode) or neither (CPU mode)"
        )
    roles = Roles(target, drafter)
    if roles.mode == "cpu":
        return roles
    if set(target) & set(drafter) and target != drafter:
        raise ConfigError(
            f"--target-gpus '{target_text}' and --drafter-gpus '{drafter_text}': the lists must "
            "be equal (colocated) or disjoint (split)"
        )
    require_gpus("--target-gpus", target_text, target)
    require_gpus("--drafter-gpus", drafter_text, drafter)
    if len(set(target) | set(drafter)) > 1:
        raise ConfigError(
            f"--target-gpus '{target_text}' --drafter-gpus '{drafter_text}': multi-GPU "
            "split/colocated pipeline is not implemented yet (part 2); use one GPU for both"
        )
    return roles


def require_gpus(flag: str, text: str, ids: list[int]) -> None:
    """Fail clearly when GPUs are asked for that this machine does not have."""
    if not ids:
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{flag} '{text}': CUDA is not available to torch {torch.__version__}; "
            "leave the GPU flags empty to run on the CPU"
        )
    count = torch.cuda.device_count()
    if max(ids) >= count:
        raise ConfigError(f"{flag} '{text}': GPU {max(ids)} does not exist ({count} visible)")


def device_of(ids: list[int]) -> torch.device:
    """The device of this process for a role (part 1: the first and only GPU, or the CPU)."""
    return torch.device(f"cuda:{ids[0]}") if ids else torch.device("cpu")
