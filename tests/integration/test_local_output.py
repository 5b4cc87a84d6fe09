"""What a user sees on the screen (ansible.cfg's dflash stdout callback and display settings):
a wait is progress lines, not FAILED - RETRYING; a no-op deploy fits on a screen and says
nothing about waiting; a failure is printed once, with the task's place."""

from __future__ import annotations

import configparser
import re

from tests.helpers import REPO
from tests.integration.conftest import TRAINER_ARGS, add_release

# The display settings of ansible.cfg, over the every-task display the other tests use.
_CFG = configparser.ConfigParser()
_CFG.read(REPO / "ansible.cfg")
AS_CONFIGURED = {
    f"ANSIBLE_{key.upper()}": _CFG["dflash_callback"][key]
    for key in ("display_ok_hosts", "display_skipped_hosts")
}
# A no-op deploy measured 12 lines (PLAY, "Nothing to change on local", PLAY RECAP).
NOOP_MAX_LINES = 15
WAIT = "Wait for the trainer's health check - 5 training steps of release v"


def test_the_screen_shows_progress_and_a_no_op_fits(deploy, trainer_repo):
    # 8 s a step: the trainer steps for 40 s or more, however long it takes to start on a loaded
    # machine; progress lines come at doubling intervals but at most 30 s apart (ansible.cfg's
    # progress_interval), so one of them falls while it steps. (With 5 s a step, a start of 28 s
    # under two CPU burners put the 25 s of steps between two lines.)
    args = dict(TRAINER_ARGS, sleep_per_step=8.0)
    first = deploy("v1", dflash_trainer_args=args, _env=AS_CONFIGURED)
    assert first.rc == 0, first.output
    assert "FAILED - RETRYING" not in first.output, first.output
    # The wait's task names what it waits on, then progress lines: the seconds waited and, once
    # the trainer runs, its step (action_plugins/dflash_wait.py).
    waited = first.output.split(WAIT + "1 within 180 s")[1].split("TASK [")[0]
    progress = r"^\[local\] still waiting: \d+ s \(at most \d+ s\), step [0-5] of 5$"
    assert re.search(progress, waited, re.MULTILINE), first.output

    again = deploy("v1", dflash_trainer_args=args, _env=AS_CONFIGURED)
    assert again.rc == 0 and again.changed() == 0, again.output
    assert "Nothing to change on local" in again.text, again.output
    lines = again.output.splitlines()
    assert len(lines) <= NOOP_MAX_LINES, again.output
    assert not [line for line in lines if "wait" in line.lower()], again.output

    # Check mode waits on no health check and says so. Its read of what the launch would do
    # may show that it is still reading (a loaded machine took 3 s), never a training step.
    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2\n")
    dry = deploy("v2", dflash_trainer_args=args, _check=True, _env=AS_CONFIGURED)
    assert dry.rc == 0 and "would restart the trainer of release v2" in dry.text, dry.output
    assert WAIT not in dry.output and not re.search(r"still waiting: .*, step", dry.output), (
        dry.output
    )


def test_a_failure_is_printed_once_with_its_place(deploy):
    failed = deploy("v1", dflash_keep_releases=0, _env=AS_CONFIGURED)
    message = "dflash_keep_releases=0 would prune the current release; use 1 or more."
    assert failed.rc != 0 and failed.output.count(message) == 1, failed.output
    assert f"fatal: [local]: {message}" in failed.output
    assert "task: roles/dflash_preflight/tasks/main.yml:" in failed.output
    # No second rendering: the error summary's source excerpt, the result's YAML.
    assert "Origin:" not in failed.output and "evaluated_to" not in failed.output
