"""The optimisation loop body: AdamW, warmup + cosine schedule, clipping, resumable state."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dflash.model import Drafter
from dflash.optimizer import clip_and_step
from dflash.pipeline import FeatureBatch, FeatureSource
from dflash.stages import Clock
from dflash.step import DrafterStep


def lr_at(step: int, base_lr: float, max_steps: int, warmup_ratio: float) -> float:
    """Linear warmup over warmup_ratio * max_steps, then cosine decay to 0 at max_steps."""
    warmup = max(1, round(warmup_ratio * max_steps))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class StepResult:
    step: int  # optimizer steps done, this one included
    loss: float
    lr: float
    num_tokens: int
    grad_norm: float  # of all gradients before clipping (non-finite when they are)
    stages: dict[str, float] = field(default_factory=dict)  # seconds of this step, by stage


class Trainer:
    """Every random choice of step k derives from (seed, k), so a resumed run repeats exactly
    what an uninterrupted one would have done."""

    def __init__(
        self,
        drafter: Drafter,
        source: FeatureSource,
        step_fn: DrafterStep,
        *,
        lr: float,
        max_steps: int,
        warmup_ratio: float,
        grad_clip: float,
        seed: int,
    ) -> None:
        self.drafter = drafter
        self.source = source
        self.step_fn = step_fn
        self.base_lr = lr
        self.max_steps = max_steps
        self.warmup_ratio = warmup_ratio
        self.grad_clip = grad_clip
        self.seed = seed
        self.params = list(drafter.parameters())
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=lr,
            weight_decay=0.0,
            fused=step_fn.on_gpu,
        )
        self.clock = Clock(step_fn.device)
        self.step = 0
        self.tokens = 0

    def train_step(self, check: Callable[[FeatureBatch, int], None] | None = None) -> StepResult:
        """One optimizer step; `check` first sees its batch and anchor seed (the canary's
        comparison with the eager step, dflash.eager_reference)."""
        lr = lr_at(self.step, self.base_lr, self.max_steps, self.warmup_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.source.next()
        ready = self.clock.mark()
        seed = self.seed * 1_000_003 + self.step
        if check is not None:
            check(batch, seed)
        generator = torch.Generator().manual_seed(seed)
        loss = self.step_fn.loss(batch, generator)
        forward = self.clock.mark()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        backward = self.clock.mark()
        grad_norm = clip_and_step(self.optimizer, self.params, self.grad_clip)
        done = self.clock.mark()
        value = loss.item()  # synchronises: every mark of the step can be read now
        self.step += 1
        self.tokens += batch.num_tokens
        stages = {
            **batch.timings.resolve(),
            "drafter_forward": Clock.seconds(ready, forward),
            "drafter_backward": Clock.seconds(forward, backward),
            "optimizer": Clock.seconds(backward, done),
        }
        return StepResult(self.step, value, lr, batch.num_tokens, grad_norm.item(), stages)

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "drafter": self.drafter.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data": self.source.state_dict(),
        }

    def load_state_dict(self, step: int, state: dict[str, Any]) -> bool:
        """Restore a checkpoint; False when the data changed and its order starts over."""
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = step
        self.tokens = state["tokens"]
        return self.source.load_state_dict(state["data"])
