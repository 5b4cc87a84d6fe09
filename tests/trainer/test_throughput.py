"""tokens/s in status.json: the first step (compilation) stops counting once a second is done."""

from __future__ import annotations

import pytest

from dflash import train


def test_first_step_leaves_the_window_after_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 100.0, 101.0, 102.0])  # a 100 s first step, then 1 s steps
    monkeypatch.setattr(train.time, "monotonic", lambda: next(clock))
    meter = train.Throughput()
    assert meter.add(1000) == pytest.approx(10.0)
    assert meter.add(1000) == pytest.approx(1000.0)
    assert meter.add(1000) == pytest.approx(1000.0)
    assert meter.last_step_s == pytest.approx(1.0)
    # Two steps measured of a 20-step window: an early figure, which verify.yml does not judge.
    assert meter.window == {"steps": 2, "size": 20}


def test_completed_windows_are_median_steps_and_a_stall_does_not_move_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """status.json's throughput_windows: one figure per completed window of steps (the first
    step left out), its median step, so one stalled step does not read as a slow window."""
    steps = [50.0] + [1.0] * 4 + [1.0, 9.0, 1.0, 1.0] + [2.0] * 4  # a compile, then windows of 4
    times = [0.0]
    for step in steps:
        times.append(times[-1] + step)
    clock = iter(times)
    monkeypatch.setattr(train.time, "monotonic", lambda: next(clock))
    meter = train.Throughput(window=4)
    for _ in steps:
        meter.add(100)
    assert list(meter.windows) == [100.0, 100.0, 50.0]
    assert meter.step_spread == 0.0  # the last four steps were alike
