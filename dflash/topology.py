"""GPU roles: parse --target-gpus / --drafter-gpus and lay the work out over torchrun's ranks.

Modes: "cpu" (both empty: one process), "colocated" (equal lists: each rank runs the target and
the drafter), "split" (disjoint lists: target ranks stream features to drafter ranks). One
process per GPU: a node runs as many ranks as it has distinct GPUs in the two lists, and every
node has the same layout (torchrun numbers ranks node by node: RANK = node * per_node +
LOCAL_RANK). `plan_layout` is a pure function of the lists and the world size.
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


def resolve_roles(target_text: str, drafter_text: str, check_gpus: bool = True) -> Roles:
    """Validate the two GPU lists against each other and (check_gpus) against this machine."""
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
    if roles.mode == "split" and len(target) > len(drafter):
        raise ConfigError(
            f"--target-gpus '{target_text}' --drafter-gpus '{drafter_text}': more target than "
            "drafter GPUs; each target GPU serves at least one drafter GPU"
        )
    if check_gpus:
        require_gpus("--target-gpus", target_text, target)
        require_gpus("--drafter-gpus", drafter_text, drafter)
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
    """The device of a one-process run: the first and only GPU, or the CPU."""
    return torch.device(f"cuda:{ids[0]}") if ids else torch.device("cpu")


@dataclass(frozen=True)
class Rank:
    """What one process does: run the target, train the drafter, or both (colocated)."""

    rank: int
    gpu: int | None  # None: the CPU
    target: bool
    drafter: bool

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.gpu is None else torch.device(f"cuda:{self.gpu}")


@dataclass(frozen=True)
class Layout:
    mode: str
    ranks: tuple[Rank, ...]  # by global rank
    source: dict[int, int]  # drafter rank -> the rank computing its features (itself if colocated)
    per_node: int = 1  # ranks per node (torchrun's --nproc-per-node)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def nnodes(self) -> int:
        return self.world_size // self.per_node

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def reports(self, rank: int) -> bool:
        """The first drafter rank of each node writes that node's status.json (the deploy's
        health check and verify read it on every host of a multi-node job)."""
        return rank == min(r for r in self.drafter_ranks if self.node_of(r) == self.node_of(rank))

    @property
    def drafter_ranks(self) -> list[int]:
        return [r.rank for r in self.ranks if r.drafter]

    @property
    def lead(self) -> int:
        """The first drafter rank: it alone writes checkpoints and the log (and status.json on
        its node)."""
        return self.drafter_ranks[0]

    def served_by(self, rank: int) -> list[int]:
        """The drafter ranks a target rank sends features to (none when colocated)."""
        return [d for d, t in self.source.items() if t == rank and d != rank]

    def shard(self, rank: int) -> int:
        """A drafter rank's data shard: its index among the drafter ranks."""
        return self.drafter_ranks.index(rank)


def plan_layout(roles: Roles, world_size: int, on_cpu: bool = False) -> Layout:
    """Rank -> role, GPU and feature source; `on_cpu` lays the same ranks out on the CPU (tests).

    Split: on each node the first ranks run the target GPUs in list order, the next ones the
    drafter GPUs; drafter j of a node gets its features from target j % T of that node.
    """
    if roles.mode == "cpu" and world_size > 1:
        raise ConfigError(
            f"CPU mode (no --target-gpus / --drafter-gpus) runs one process; this job has "
            f"{world_size}: start python -m dflash.train without torchrun"
        )
    gpus = roles.target if roles.mode == "colocated" else roles.target + roles.drafter
    per_node = max(1, len(gpus))
    if world_size % per_node:
        raise ConfigError(
            f"--target-gpus '{_text(roles.target)}' --drafter-gpus '{_text(roles.drafter)}' "
            f"need {per_node} processes per node; this job has {world_size} in all "
            f"(start it with python -m torch.distributed.run --nproc-per-node {per_node} "
            "-m dflash.train ...)"
        )
    ranks: list[Rank] = []
    source: dict[int, int] = {}
    num_targets = len(roles.target)
    for rank in range(world_size):
        node, local = divmod(rank, per_node)
        gpu = None if roles.mode == "cpu" or on_cpu else gpus[local]
        if roles.mode != "split":
            ranks.append(Rank(rank, gpu, target=True, drafter=True))
            source[rank] = rank
            continue
        is_target = local < num_targets
        ranks.append(Rank(rank, gpu, target=is_target, drafter=not is_target))
        if not is_target:
            source[rank] = node * per_node + (local - num_targets) % num_targets
    return Layout(roles.mode, tuple(ranks), source, per_node)


def _text(ids: list[int]) -> str:
    return ",".join(map(str, ids))
