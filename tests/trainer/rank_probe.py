"""Run by test_loss_ranks.py under torchrun (on GPUs, or on the CPU with --cpu-ranks): build
the trainer's drafter ranks as `dflash.train` does, take one real training step and save, from
the lead, the loss as the log reports it, every drafter gradient after DDP's all-reduce, and
each rank's batch.

usage: torchrun --nproc-per-node D tests/trainer/rank_probe.py OUT.pt [dflash.train flags]
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from dflash.assemble import build_trainer
from dflash.cluster import Cluster, torchrun_rank
from dflash.config import TrainConfig
from dflash.flags import train_parser as build_parser
from dflash.pipeline import FeatureBatch
from dflash.topology import plan_layout, resolve_roles


def main(out: str, argv: list[str]) -> None:
    config = TrainConfig.from_args(build_parser().parse_args(argv))
    rank, world_size = torchrun_rank()
    roles = resolve_roles(config.target_gpus, config.drafter_gpus, check_gpus=not config.cpu_ranks)
    layout = plan_layout(roles, world_size, on_cpu=config.cpu_ranks)
    cluster = Cluster(layout, rank, config.dist_timeout)
    trainer = build_trainer(config, cluster, lambda message: None)
    taken: list[FeatureBatch] = []
    source_next = trainer.source.next

    def recording_next() -> FeatureBatch:
        taken.append(source_next())
        return taken[-1]

    trainer.source.next = recording_next  # type: ignore[method-assign]
    result = trainer.train_step()
    loss, _tokens = cluster.step_totals(result.loss, result.num_tokens)
    batch = {"input_ids": taken[0].input_ids.cpu(), "loss_mask": taken[0].loss_mask.cpu()}
    batches: list[dict | None] = [None] * cluster.num_drafters
    dist.all_gather_object(batches, batch, group=cluster.drafters_control)
    if rank == cluster.layout.lead:
        grads = {name: p.grad.cpu() for name, p in trainer.drafter.named_parameters()}
        torch.save({"loss": loss, "grads": grads, "batches": batches}, out)
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
