"""Stage times: spans read from marks, window means, the first (compiling) step left out."""

from __future__ import annotations

import torch

from dflash.stages import STAGES, Clock, StageWindow, Timings, stage_text


def test_window_means_leave_the_first_step_out_once_a_second_is_done():
    window = StageWindow(window=3)
    window.add({"drafter_forward": 100.0, "step": 100.0})  # the compiling first step
    assert window.means()["drafter_forward"] == 100.0
    for seconds in (1.0, 2.0, 3.0):
        window.add({"drafter_forward": seconds, "transfer": seconds / 10, "step": 2 * seconds})
    means = window.means()
    assert list(means) == list(STAGES)
    assert means["drafter_forward"] == 2.0 and means["transfer"] == 0.2 and means["step"] == 4.0
    assert means["target_forward"] is None  # a stage this mode does not have
    assert stage_text(means) == "transfer 0.200 drafter_forward 2.000 step 4.000"


def test_timings_resolve_spans_and_values():
    clock = Clock(torch.device("cpu"))
    start = clock.mark()
    end = clock.mark()
    timings = Timings(spans={"drafter_idle": (start, end)}, values={"target_forward": 0.5})
    resolved = timings.resolve()
    assert resolved["target_forward"] == 0.5
    assert resolved["drafter_idle"] == end - start >= 0
