"""Goodput: the share of a run's wall time spent making training steps, and where the rest went.

Computed from what the supervisor saw of each start of the trainer (an attempt: its start,
its end and why) and what the trainer's status.json said (first step, last step, newest
checkpoint saved in that attempt, seconds spent saving checkpoints). Every second of the
run's wall time falls in exactly one bucket, so the buckets add up to the wall time:

- productive: steps whose work was kept (up to the attempt's last checkpoint, or to now or the
  clean stop of an attempt that did not crash), less the time spent saving checkpoints;
- startup: from a process start to its first step done (loading, resuming, compiling);
- checkpoint: saving checkpoints;
- lost: steps past the last checkpoint of an attempt that crashed or hung (they are redone);
- hang: from the last step of a hung attempt to its kill;
- down: no trainer process (the supervisor's back-off, a restart's spawn).

What it cannot see: a step that is slow but makes progress (that is throughput, not goodput);
time before the supervisor started (the deploy itself); work lost inside a step that the
trainer retried on its own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

CAUSES = ("startup", "checkpoint", "lost", "hang", "down")


def epoch(stamp: str | None) -> float | None:
    """Seconds since the epoch of an ISO time as status.json writes it (None stays None)."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def attempt_buckets(attempt: dict[str, Any], now: float) -> dict[str, float]:
    """One attempt's seconds by bucket (productive and the causes but `down`)."""
    start = attempt["started"]
    end = attempt.get("ended") or now
    out = dict.fromkeys(("productive", *CAUSES), 0.0)
    first = epoch(attempt.get("first_step_at"))
    if first is None or first > end:  # never made a step: all of it was start-up
        out["startup"] = end - start
        return out
    first = _clamp(first, start, end)
    out["startup"] = first - start
    saving = min(float(attempt.get("checkpoint_seconds") or 0.0), end - first)
    out["checkpoint"] = saving
    how = attempt.get("end_reason")
    if how in ("crash", "hung"):
        last = _clamp(epoch(attempt.get("last_step_at")) or first, first, end)
        saved = epoch(attempt.get("checkpoint_at"))  # a checkpoint this attempt wrote
        kept_until = _clamp(saved, first, last) if saved is not None else first
        if how == "hung":
            out["hang"] = end - last
            out["lost"] = last - kept_until
        else:
            out["lost"] = end - kept_until
        # Checkpoint saves all lie before the newest checkpoint's end: inside the kept span.
        out["checkpoint"] = min(saving, kept_until - first)
        out["productive"] = kept_until - first - out["checkpoint"]
    else:
        out["productive"] = end - first - saving
    return out


def goodput(attempts: list[dict[str, Any]], started: float, now: float) -> dict[str, Any]:
    """The run's buckets from `started` (the supervisor's start) to `now` (or its end)."""
    totals = dict.fromkeys(("productive", *CAUSES), 0.0)
    previous_end = started
    for attempt in attempts:
        totals["down"] += max(0.0, attempt["started"] - previous_end)
        for key, seconds in attempt_buckets(attempt, now).items():
            totals[key] += seconds
        previous_end = attempt.get("ended") or now
    totals["down"] += max(0.0, now - previous_end)
    wall = now - started
    return {
        "wall_s": round(wall, 3),
        "productive_s": round(totals["productive"], 3),
        "ratio": round(totals["productive"] / wall, 4) if wall > 0 else None,
        "badput_s": {cause: round(totals[cause], 3) for cause in CAUSES},
    }
