"""The toolkit's trainer states (module_utils/dflash_states.py) are the trainer's own
(dflash/supervision/status.py), and each group the toolkit judges by is made of them."""

from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils import dflash_states
from dflash.supervision.status import STATES


def test_the_toolkit_knows_exactly_the_trainers_states():
    assert dflash_states.STATES == STATES
    for group in ("ALIVE", "TRAINING", "STEPPING"):
        assert set(getattr(dflash_states, group)) <= set(STATES), group
    assert set(dflash_states.STEPPING) <= set(dflash_states.TRAINING) <= set(dflash_states.ALIVE)
