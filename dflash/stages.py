"""Per-stage timing without a profiler: marks on the device's timeline, seconds per step.

On a GPU a mark is a CUDA event recorded on the current stream, so a span measures what the
GPU did between two points without stalling it; spans are read once the step has synchronised
(the loss is read back every step). On the CPU a mark is the wall clock.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

Mark = float | torch.cuda.Event

# Seconds per optimizer step, as reported in status.json's "stages" and the log.
STAGES = (
    "target_forward",  # the frozen target's forward (on the target GPU, or this one colocated)
    "transfer",  # sending the features to the drafter rank (split mode)
    "target_idle",  # the target rank waiting for a drafter to take more (split mode)
    "drafter_idle",  # the drafter rank waiting for its features (split mode)
    "drafter_forward",  # anchors, mask, drafter forward and the chunked lm_head loss
    "drafter_backward",  # backward, with the data-parallel gradient all-reduce it overlaps
    "optimizer",  # clipping and AdamW
    "step",  # wall clock from one step to the next on the drafter rank: what tokens/s sees
)


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Mark:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @staticmethod
    def seconds(start: Mark, end: Mark) -> float:
        """Seconds between two marks; waits for the end mark on a GPU."""
        if isinstance(start, float) and isinstance(end, float):
            return end - start
        assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
        end.synchronize()
        return start.elapsed_time(end) / 1e3


@dataclass
class Timings:
    """A step's stage times: spans still to be read, and values already known."""

    spans: dict[str, tuple[Mark, Mark]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)

    def resolve(self) -> dict[str, float]:
        return {**self.values, **{k: Clock.seconds(a, b) for k, (a, b) in self.spans.items()}}


class StageWindow:
    """Mean seconds per step of each stage over the last `window` steps (absent: null).

    Like tokens/s, the first step (lazy init, compilation) leaves once a second one is done."""

    def __init__(self, window: int = 20) -> None:
        self.steps: deque[dict[str, float]] = deque(maxlen=window)
        self.count = 0

    def add(self, stages: dict[str, float]) -> None:
        self.steps.append(stages)
        self.count += 1
        if self.count == 2:
            self.steps.popleft()

    def means(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name in STAGES:
            values = [s[name] for s in self.steps if name in s]
            out[name] = round(sum(values) / len(values), 4) if values else None
        return out


def stage_text(means: dict[str, float | None]) -> str:
    """`target_forward 0.101 drafter_forward 0.080 ...` for the log (known stages only)."""
    return " ".join(f"{name} {value:.3f}" for name, value in means.items() if value is not None)
