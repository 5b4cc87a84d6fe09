"""Where the drafter's inputs come from: batches plus the target's context features.

`LocalFeatureSource` runs the target in the drafter's process (CPU, colocated GPUs);
`RemoteFeatureSource` receives the same `FeatureBatch` from a target rank (split mode). The
trainer does not know which one it has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from dflash.data.order import ShardedOrder
from dflash.stages import Clock, Timings
from dflash.target import Target
from dflash.transport import UNKNOWN, FeatureReceiver


@dataclass
class FeatureBatch:
    input_ids: Tensor  # [rows, S] on the drafter's device
    loss_mask: Tensor  # [rows, S] bool
    features: Tensor  # [rows, S, n*H] target context features
    num_tokens: int
    timings: Timings = field(default_factory=Timings)  # how the batch was made, by stage


class FeatureSource(Protocol):
    data: dict[str, Any]  # what the run trains on: the data store's summary

    def next(self) -> FeatureBatch: ...

    def credit(self, more: bool) -> None:
        """Before each step: one more batch will be taken (True), or none (False, stop)."""

    def close(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> bool: ...


class LocalFeatureSource:
    """Runs the frozen target on each batch of this rank's data shard, in this process."""

    def __init__(
        self, target: Target, order: ShardedOrder, shard: int, device: torch.device
    ) -> None:
        self.target = target
        self.order = order
        self.shard = shard
        self.device = device
        self.clock = Clock(target.device)
        self.data = order.data

    def next(self) -> FeatureBatch:
        start = self.clock.mark()
        (batch,) = self.order.next_step([self.shard])
        features, _ = self.target.forward(batch.input_ids.to(self.target.device))
        out = FeatureBatch(
            input_ids=batch.input_ids.to(self.device),
            loss_mask=batch.loss_mask.to(self.device),
            features=features.to(self.device),
            num_tokens=batch.num_tokens,
        )
        out.timings.spans["target_forward"] = (start, self.clock.mark())
        return out

    def credit(self, more: bool) -> None:
        pass  # nothing runs ahead

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        return self.order.load_state_dict(state)


class RemoteFeatureSource:
    """Feature batches from a target rank; the data order's state travels in each header.

    The receiver (which posts receives at once) is made at the first credit: after start-up,
    when the target rank has joined the resume hand-off and is about to send.
    """

    def __init__(
        self, receiver: Callable[[], FeatureReceiver], device: torch.device, data: dict[str, Any]
    ) -> None:
        self.make_receiver = receiver
        self.receiver: FeatureReceiver | None = None
        self.clock = Clock(device)
        self.data = data
        self.data_state: dict[str, Any] = {}

    def _receiver(self) -> FeatureReceiver:
        if self.receiver is None:
            self.receiver = self.make_receiver()
        return self.receiver

    def next(self) -> FeatureBatch:
        start = self.clock.mark()
        received = self._receiver().take()
        header = received.header
        self.data_state = {
            **{k: int(header[k]) for k in ("epoch", "index", "position", "num_samples")},
            "data_sha256": self.data.get("content_sha256"),
        }
        out = FeatureBatch(
            input_ids=received.input_ids,
            loss_mask=received.loss_mask,
            features=received.features,
            num_tokens=int(header["num_tokens"]),
        )
        out.timings.spans["drafter_idle"] = (start, self.clock.mark())
        for name in ("target_forward", "transfer", "target_idle"):
            if header[name] != UNKNOWN:
                out.timings.values[name] = header[name]
        return out

    def credit(self, more: bool) -> None:
        self._receiver().credit(more)

    def close(self) -> None:
        self._receiver().drain()

    def state_dict(self) -> dict[str, Any]:
        return dict(self.data_state)

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """The target ranks position the order (they hold the data); remember it for the next
        checkpoint, which may come before the first batch. False, as the target ranks decide,
        when the checkpoint's order is of other data."""
        same = (state.get("data_sha256"), state.get("num_samples")) == (
            self.data.get("content_sha256"),
            self.data.get("samples_in_order"),
        )
        if not same or "position" not in state:
            return False
        self.data_state = dict(state)
        return True
