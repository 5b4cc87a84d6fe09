"""The trainer's states (status.json) and its supervisor's (supervisor.json), and what each
means to whoever watches the run: both files write a state's meanings beside it (`state_is`),
so a reader (verify, the launch) judges by the meanings and follows a release that renames or
adds a state. Stdlib only: the supervisor reads status.json without importing torch."""

from __future__ import annotations

from typing import Any

# Each state of the trainer and what it means: `alive` (it beats its heartbeat),
# `training` (compiling its step or stepping: a deploy keeps it), `stepping` (past its first
# optimizer step: its tokens/s can be judged), `steps_due` (a step is due within the hang
# limit; a checkpoint or a compile may take longer), `saving` (a checkpoint save runs: it is
# due to end within the save limit), `failed`.
STATES: dict[str, tuple[str, ...]] = {
    "starting": ("alive",),
    "warming": ("alive", "training"),
    "running": ("alive", "training", "stepping", "steps_due"),
    "checkpointing": ("alive", "training", "stepping", "saving"),
    "stopped": (),
    "failed": ("failed",),
}
MEANINGS = ("alive", "training", "stepping", "steps_due", "saving", "failed")


def state_fields(state: str) -> dict[str, Any]:
    """A state as status.json writes it: its name and what it means (`state_is`)."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}")
    return {"state": state, "state_is": list(STATES[state])}


def state_is(status: dict[str, Any], meaning: str) -> bool:
    """Whether a status.json's state means `meaning` (one of MEANINGS)."""
    return meaning in STATES.get(str(status.get("state")), ())


# Each state of the supervisor and what it means: `supervising` (it watches a trainer or will
# start one: its process must live), `not_training` (no trainer trains now: said beside the
# restarts), `down` (the trainer ended; the supervisor starts it again after a back-off),
# `gave_up` (a crash loop: it starts nothing until the next deploy).
SUPERVISOR_STATES: dict[str, tuple[str, ...]] = {
    "starting": (),
    "running": ("supervising",),
    "hung": ("supervising", "not_training"),
    "backoff": ("supervising", "not_training", "down"),
    "crash_loop": ("not_training", "gave_up"),
    "stopped": (),
}
SUPERVISOR_MEANINGS = ("supervising", "not_training", "down", "gave_up")
