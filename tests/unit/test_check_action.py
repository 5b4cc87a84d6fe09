"""action_plugins/dflash_check.py, run by ansible-playbook with the repository's ansible.cfg:
problems fail the task with every message in order (warnings still shown), warnings alone pass,
notes show without -v as a debug message does, and a check with nothing to say stays silent."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.helpers import ANSIBLE_PLAYBOOK, REPO, playbook_env

INVENTORY = "localhost ansible_connection=local ansible_python_interpreter={python}\n"


def play(tmp_path: Path, **check: object) -> subprocess.CompletedProcess[str]:
    tasks = [
        {"name": "The check under test", "dflash_check": check},
        {"name": "The task after it", "ansible.builtin.debug": {"msg": "reached the next task"}},
    ]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False,
                                     "tasks": tasks}]))  # fmt: skip
    inventory = tmp_path / "hosts"
    inventory.write_text(INVENTORY.format(python=Path(ANSIBLE_PLAYBOOK).parent / "python"))
    env = playbook_env()
    # Only what says something shows, as ansible.cfg has it (playbook_env shows every task).
    env.update(ANSIBLE_DISPLAY_OK_HOSTS="false", ANSIBLE_DISPLAY_SKIPPED_HOSTS="false")
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_problems_fail_with_every_message_and_the_warnings_still_show(tmp_path):
    run = play(tmp_path, problems=["keep-N is 0; use 1 or more.", "the root is relative."],
               warnings=["dlfash_ref is unknown"])  # fmt: skip
    text = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 2, text
    assert "fatal: [localhost]: keep-N is 0; use 1 or more. the root is relative." in text
    assert "[WARNING]: dlfash_ref is unknown" in text
    assert "reached the next task" not in text


def test_warnings_alone_pass_and_notes_show_without_v(tmp_path):
    run = play(tmp_path, warnings=["mind the layout"], notes=["started container 200"])
    text = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 0, text
    assert "[WARNING]: mind the layout" in text
    assert "TASK [The check under test]" in text and "msg: started container 200" in text
    assert "reached the next task" in text


def test_a_check_with_nothing_to_say_shows_nothing(tmp_path):
    run = play(tmp_path, problems=[], warnings=[], notes=[])
    assert run.returncode == 0, run.stdout
    assert "The check under test" not in run.stdout and "reached the next task" in run.stdout


def test_an_unknown_option_is_refused_by_name(tmp_path):
    run = play(tmp_path, problem=["typo of problems"])
    assert run.returncode == 2 and "problem" in run.stdout, run.stdout
