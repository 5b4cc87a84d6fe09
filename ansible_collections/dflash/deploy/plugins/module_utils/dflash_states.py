# The trainer's states, as its status.json says them (dflash/supervision/status.py STATES),
# and the groups
# of them that the toolkit judges by: one definition for the launch, the no-op decision,
# verify and its job verdict (tests/unit/test_states.py holds STATES to the trainer's own).
# Standard library only: the target's modules and the controller's filters use it alike.
from __future__ import annotations

STATES = ("starting", "warming", "running", "checkpointing", "stopped", "failed")
# A live trainer, whose status.json must keep beating (verify's heartbeat_stale).
ALIVE = ("starting", "warming", "running", "checkpointing")
# A trainer that trains, or is about to (compiling): the launch keeps it, a job counts it.
TRAINING = ("warming", "running", "checkpointing")
# Past its first optimizer step: its tokens/s can be judged (verify's throughput).
STEPPING = ("running", "checkpointing")
