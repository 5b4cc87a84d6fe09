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


class FakeClock:
    """ThreadClock's answers, one per step: (the busiest thread ran, the longest wait)."""

    def __init__(self, steps: list[tuple[float, float]]) -> None:
        self.steps = iter(steps)

    def step(self) -> tuple[float, float]:
        return next(self.steps)


def test_unstarved_windows_leave_out_the_wait_for_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window whose steps took 2 s, 1.5 s of it waiting for a CPU, is 4x faster unstarved; a
    window of stopped steps (no wait) stays as slow as measured."""
    steps = [(50.0, (50.0, 0.0))] + [(2.0, (0.5, 1.5))] * 4 + [(2.0, (0.5, 0.0))] * 4
    times = [0.0]
    for wall, _ in steps:
        times.append(times[-1] + wall)
    clock = iter(times)
    monkeypatch.setattr(train.time, "monotonic", lambda: next(clock))
    meter = train.Throughput(window=4, clock=FakeClock([cpu for _, cpu in steps]))
    for _ in steps:
        meter.add(100)
    assert list(meter.windows) == [50.0, 50.0]
    assert list(meter.unstarved_windows) == [200.0, 50.0]
    assert meter.unstarved_tokens_per_s == 50.0  # the last four steps, stopped, not starved
