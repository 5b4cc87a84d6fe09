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
