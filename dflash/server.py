"""A target rank in split mode: the frozen target's forward for its drafter ranks, streamed.

Each step takes the global data order one step on (`ShardedOrder`: the batches of the drafters
this rank serves), runs the target on them and sends the features; credits from the drafters
bound how far it runs ahead (`dflash.transport`). Every header carries this rank's seconds per
step of the step before (forward, transfer, idle), which the lead drafter reports.
"""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from dflash.data.order import ShardedOrder
from dflash.stages import Clock, Mark
from dflash.target import Target
from dflash.transport import UNKNOWN, send_header, send_payload, wait_credit


class FeatureServer:
    def __init__(
        self,
        target: Target,
        order: ShardedOrder,
        drafters: list[int],
        shards: list[int],
        depth: int,
        control: Any,
    ) -> None:
        self.target = target
        self.order = order
        self.drafters = drafters  # global ranks, in the order of `shards`
        self.shards = shards
        self.depth = depth
        self.control = control
        self.clock = Clock(target.device)

    def _credits(self) -> bool:
        """True when every drafter asks for one more batch (they agree on when to stop)."""
        answers = [wait_credit(rank, self.control) for rank in self.drafters]
        if len(set(answers)) != 1:
            raise RuntimeError(f"drafter ranks {self.drafters} disagree on stopping: {answers}")
        return answers[0]

    def run(self) -> int:
        """Serve until the drafters say stop; returns the steps served."""
        previous: list[tuple[Mark, Mark, Mark]] = []
        previous_start = 0.0
        headers: list[dist.Work] = []
        step = 0
        while step < self.depth or self._credits():
            start = time.perf_counter()
            batches = self.order.next_step(self.shards)
            state = self.order.position()
            marks = []
            for rank, batch in zip(self.drafters, batches, strict=True):
                begin = self.clock.mark()
                features, _ = self.target.forward(batch.input_ids.to(self.target.device))
                computed = self.clock.mark()
                ids, mask = batch.input_ids.to(features.device), batch.loss_mask.to(features.device)
                for work in send_payload(ids, mask, features, rank):
                    work.wait()  # on a GPU: the stream waits for the copy, timed as the transfer
                marks.append((begin, computed, self.clock.mark()))
            timing = self._timing(previous, start - previous_start)
            for w in headers:
                w.wait()
            headers = [
                send_header(
                    {"seq": step, "num_tokens": batch.num_tokens, **state, **timing},
                    rank,
                    self.control,
                )
                for rank, batch in zip(self.drafters, batches, strict=True)
            ]
            previous, previous_start = marks, start
            step += 1
        for w in headers:
            w.wait()
        return step

    @staticmethod
    def _timing(marks: list[tuple[Mark, Mark, Mark]], wall: float) -> dict[str, float]:
        """The previous step's forward, transfer and idle seconds (all its batches together)."""
        if not marks:
            return {"target_forward": UNKNOWN, "transfer": UNKNOWN, "target_idle": UNKNOWN}
        forward = sum(Clock.seconds(a, b) for a, b, _ in marks)
        transfer = sum(Clock.seconds(b, c) for _, b, c in marks)
        return {
            "target_forward": forward,
            "transfer": transfer,
            "target_idle": max(0.0, wall - forward - transfer),
        }
