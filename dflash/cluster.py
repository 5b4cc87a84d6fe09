"""torch.distributed for the trainer's ranks: process groups, agreement, sharing small objects.

Groups: the default one carries tensors (NCCL between GPUs, gloo on the CPU): features and the
frozen weights in split mode; `control` (gloo, every rank) carries headers, credits and small
objects, so none of them stalls a GPU; `drafters` (default backend) is the data-parallel group
of the drafter ranks and `drafters_control` (gloo) their per-step agreement. Every wait is
bounded by the process-group timeout, so a rank that dies never leaves the others hanging.
A job of one process has no process group: the same calls answer locally.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dflash.topology import Layout, Rank


def torchrun_rank() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as torchrun sets them; (0, 1) when started without it."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def job_fields(layout: Layout, rank: int) -> dict[str, Any]:
    """status.json's `job`: which node of which torchrun job this is. `rdzv_id` is torchrun's
    rendezvous id (TORCHELASTIC_RUN_ID), the same on every node of one job; `world_size` is the
    rank count the rendezvous formed, so the lead's figure says whether every node joined."""
    return {
        "rdzv_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "node_rank": layout.node_of(rank),
        "nnodes": layout.nnodes,
        "world_size": layout.world_size,
        "lead": rank == layout.lead,
    }


class Cluster:
    def __init__(self, layout: Layout, rank: int, timeout_s: float) -> None:
        self.layout = layout
        self.rank = rank
        self.me: Rank = layout.ranks[rank]
        self.distributed = layout.world_size > 1
        self.control: Any = None
        self.drafters: Any = None
        self.drafters_control: Any = None
        device = self.me.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not self.distributed:
            return
        timeout = timedelta(seconds=timeout_s)
        # No device_id: with an eagerly initialised NCCL group, new_group makes the ranks
        # outside a subgroup join an ncclCommSplit at once while its members split only at
        # first use, and split mode (target ranks outside the drafter group) deadlocked at
        # start on two H200s. Lazily, each communicator forms at its first operation.
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout)
        # new_group is collective: every rank creates every group, in the same order.
        self.control = dist.new_group(backend="gloo", timeout=timeout)
        self.drafters = dist.new_group(layout.drafter_ranks, timeout=timeout)
        self.drafters_control = dist.new_group(
            layout.drafter_ranks, backend="gloo", timeout=timeout
        )

    @property
    def num_drafters(self) -> int:
        return len(self.layout.drafter_ranks)

    def agree_to_stop(self, stop: bool) -> bool:
        """Drafter ranks: stop when any of them wants to, so all stop after the same step."""
        if not self.distributed:
            return stop
        flag = torch.tensor([1.0 if stop else 0.0])
        dist.all_reduce(flag, group=self.drafters_control)
        return bool(flag.item() > 0)

    def step_totals(self, loss: float, num_tokens: int) -> tuple[float, int]:
        """Drafter ranks: the loss and the tokens of this step over all drafter ranks. Each
        rank's loss is its share of the global objective scaled by the rank count
        (`dflash.step.DrafterStep`), so their mean is the global loss."""
        if not self.distributed:
            return loss, num_tokens
        values = torch.tensor([loss, float(num_tokens)], dtype=torch.float64)
        dist.all_reduce(values, group=self.drafters_control)
        return values[0].item() / self.num_drafters, int(values[1].item())

    def weight_sum(self, local: torch.Tensor) -> torch.Tensor:
        """Drafter ranks: a scalar summed over every drafter rank (the loss's global weight),
        on the drafters' own group and device."""
        total = local.detach().clone()
        if self.distributed:
            dist.all_reduce(total, group=self.drafters)
        return total

    def share(self, value: Any, src: int) -> Any:
        """Every rank gets rank `src`'s value (a small picklable object)."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=src, group=self.control)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's value (a small picklable object), by rank, on every rank."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * self.layout.world_size
        dist.all_gather_object(values, value, group=self.control)
        return values

    def share_drafters(self, value: Any, src: int) -> Any:
        """Every drafter rank gets drafter rank `src`'s value (a checkpoint of a job over
        several nodes: only the lead's node holds the file)."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=src, group=self.drafters_control)
        return box[0]

    def close(self) -> None:
        if self.distributed:
            dist.destroy_process_group()
