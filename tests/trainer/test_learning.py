"""On self-generated data the drafter learns: the loss falls and tau rises within 120 steps."""

from __future__ import annotations

import statistics

import pytest
import torch

from dflash.data import random_prompts, sample_store, self_generated
from dflash.data.order import BatchOrder, ShardedOrder
from dflash.eval import acceptance_length
from dflash.model import DrafterConfig
from dflash.options import build_drafter
from dflash.pipeline import LocalFeatureSource
from dflash.step import DrafterStep
from dflash.trainer import Trainer

STEPS = 120


@pytest.mark.slow
def test_loss_falls_and_tau_rises(tiny_target):
    cpu = torch.device("cpu")
    samples = self_generated(tiny_target, 256, 16, 48, seed=0, split="train", max_len=128)
    cfg = DrafterConfig.from_target(tiny_target.config, 2, 5, 16, tiny_target.mask_token_id)
    drafter = build_drafter(
        cfg, tiny_target.embed_weight(), tiny_target.lm_head_weight(), cpu, seed=0
    )
    order = ShardedOrder(BatchOrder(sample_store(samples), 256, 8, None, seed=0), num_shards=1)
    source = LocalFeatureSource(tiny_target, order, shard=0, device=cpu)
    step = DrafterStep(drafter, gamma=7.0, num_anchors=512, compile=False)
    schedule = dict(lr=3e-3, max_steps=STEPS, warmup_ratio=0.04, grad_clip=1.0, seed=0)
    trainer = Trainer(drafter, source, step, **schedule)
    heldout = random_prompts(tiny_target, 8, 16, seed=0, split="heldout").tolist()
    tau_before = acceptance_length(tiny_target, drafter, heldout, 32)["tau"]
    losses = [trainer.train_step().loss for _ in range(STEPS)]
    tau_after = acceptance_length(tiny_target, drafter, heldout, 32)["tau"]

    first, last = statistics.mean(losses[5:25]), statistics.mean(losses[-20:])
    assert last < first - 1.0, (first, last)
    assert tau_before < 1.15
    assert tau_after > tau_before + 0.35, (tau_before, tau_after)
