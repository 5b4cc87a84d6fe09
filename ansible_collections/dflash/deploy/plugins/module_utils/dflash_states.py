# What the state in a trainer's status.json or its supervisor's supervisor.json means, as the
# file says it (`state_is`, written by the trainer from dflash/supervision/states.py). The
# toolkit judges by these meanings, never by the states' names, so a release that renames or
# adds a state is followed without an edit here.
# Standard library only: the target's modules and the controller's filters use it alike.
from __future__ import annotations

# A file written by a release from before `state_is` (0.2.0 and older) names only its state;
# what those states meant, frozen: those releases no longer change.
BEFORE_STATE_IS = {
    "starting": ("alive",),
    "warming": ("alive", "training"),
    "running": ("alive", "training", "stepping", "steps_due"),
    "checkpointing": ("alive", "training", "stepping"),
    "failed": ("failed",),
}
BEFORE_SUPERVISOR_STATE_IS = {
    "running": ("supervising",),
    "hung": ("supervising", "not_training"),
    "backoff": ("supervising", "not_training", "down"),
    "crash_loop": ("not_training", "gave_up"),
}


def _means(record: dict | None, meaning: str, before: dict) -> bool:
    record = record or {}
    said = record.get("state_is")
    if not isinstance(said, list):
        said = before.get(str(record.get("state")), ())
    return meaning in said


def state_is(status: dict | None, meaning: str) -> bool:
    """Whether the state in `status` (a status.json) means `meaning`: `alive` (its heartbeat
    must stay fresh: verify's heartbeat_stale), `training` (compiling or stepping: the launch
    keeps it, a job counts it), `stepping` (past its first optimizer step: its tokens/s can be
    judged), `steps_due` (a step is due within the hang limit) or `failed`."""
    return _means(status, meaning, BEFORE_STATE_IS)


def supervisor_is(record: dict | None, meaning: str) -> bool:
    """Whether the state in `record` (a supervisor.json) means `meaning`: `supervising` (its
    process must live), `not_training` (no trainer trains now), `down` (in a back-off before
    the next start) or `gave_up` (a crash loop: nothing starts until the next deploy)."""
    return _means(record, meaning, BEFORE_SUPERVISOR_STATE_IS)
