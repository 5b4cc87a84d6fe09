"""action_plugins/dflash_wait.py: the health wait's progress, counted as the health check
counts its steps (module_utils/dflash_health.py), and only for the release being launched."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

_SPEC = importlib.util.spec_from_file_location(
    "dflash_wait_action", REPO / "action_plugins" / "dflash_wait.py"
)
assert _SPEC and _SPEC.loader
wait = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(wait)


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ({"release": "v2", "state": "running", "step": 3}, "step 3 of 5"),
        # Resumed from a checkpoint at step 100: the steps of this run.
        ({"release": "v2", "state": "running", "step": 102, "resumed_from_step": 100},
         "step 2 of 5"),
        # The old run's status (another release, or stopped), or none yet: nothing to say.
        ({"release": "v1", "state": "running", "step": 900}, None),
        ({"release": "v2", "state": "stopped", "step": 40}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_trainer_progress(status: dict, said: str | None) -> None:
    assert wait.trainer_progress(status, "v2", 5) == said
