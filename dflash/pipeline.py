"""Where the drafter's inputs come from: batches plus the target's context features.

Part 1 runs the target in the drafter's process (CPU, or one GPU colocated). Part 2 adds a
source that receives the same `FeatureBatch` from target ranks; the trainer does not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dflash.data import BatchOrder
from dflash.target import Target


@dataclass
class FeatureBatch:
    input_ids: Tensor  # [rows, S] on the drafter's device
    loss_mask: Tensor  # [rows, S] bool
    features: Tensor  # [rows, S, n*H] target context features
    num_tokens: int


class FeatureSource(Protocol):
    def next(self) -> FeatureBatch: ...

    def state_dict(self) -> dict[str, int]: ...

    def load_state_dict(self, state: dict[str, int]) -> bool: ...


class LocalFeatureSource:
    """Runs the frozen target on each batch, in this process."""

    def __init__(self, target: Target, order: BatchOrder, device: torch.device) -> None:
        self.target = target
        self.order = order
        self.device = device

    def next(self) -> FeatureBatch:
        batch = self.order.next()
        features, _ = self.target.forward(batch.input_ids.to(self.target.device))
        return FeatureBatch(
            input_ids=batch.input_ids.to(self.device),
            loss_mask=batch.loss_mask.to(self.device),
            features=features.to(self.device),
            num_tokens=batch.num_tokens,
        )

    def state_dict(self) -> dict[str, int]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> bool:
        return self.order.load_state_dict(state)
