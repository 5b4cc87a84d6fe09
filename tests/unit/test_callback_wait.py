"""library/dflash_wait.py: the health wait's progress, counted as the health check counts its
steps (module_utils/dflash_health.py) and only for the release being launched; the end of a
background job, read from its job file as async_status reads it."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

_SPEC = importlib.util.spec_from_file_location(
    "dflash_wait_module", REPO / "library" / "dflash_wait.py"
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


@pytest.mark.parametrize(
    ("text", "over"),
    [
        # async_wrapper's first write, before it starts the module: the job runs.
        ('{"started": true, "finished": false, "ansible_job_id": "1.2"}', False),
        # The module's result replaces it: over, whether it failed or not.
        ('{"changed": true, "msg": "healthy"}', True),
        ('{"failed": true, "msg": "health check failed"}', True),
        # async_wrapper's own end of a job it timed out or could not run.
        ('{"started": true, "finished": true, "failed": true, "msg": "timed out"}', True),
        # Caught mid-write: still running (the next read sees the whole file).
        ('{"changed": tr', False),
        # No file: over, for async_status to say `could not find job`.
        (None, True),
    ],
)  # fmt: skip
def test_job_finished_reads_the_job_file_as_async_status_does(
    tmp_path, text: str | None, over: bool
) -> None:
    job = tmp_path / "1.2"
    if text is not None:
        job.write_text(text)
    assert wait.job_finished(str(job)) is over
