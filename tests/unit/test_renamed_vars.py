"""Variables renamed for one name per concept (dflash_lock -> dflash_env_lock, dflash_lock_* ->
dflash_deploy_lock_*) still work under their old names for one release, with a warning that
names the new one; the new name wins where both are set. A real ansible-playbook run of the
dflash role, on the controller only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ANSIBLE_PLAYBOOK, playbook_env

PLAY = """
- name: Show what the roles read
  hosts: localhost
  gather_facts: false
  roles:
    - role: dflash
  tasks:
    - name: Write the values
      ansible.builtin.copy:
        content: "{{ values | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
      vars:
        values:
          env_lock: "{{ dflash_env_lock }}"
          wait: "{{ dflash_deploy_lock_wait }}"
          stale_after: "{{ dflash_deploy_lock_stale_after }}"
          break: "{{ dflash_deploy_lock_break }}"
"""
LOCK = {"python": "3.11", "torch": "2.13.0+cpu", "wheels": {}, "source": {"index": "x"}}


def run(tmp_path: Path, extravars: dict) -> tuple[dict, str]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), str(play), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter={{ ansible_playbook_python }}",
         "-e", json.dumps({**extravars, "out": str(tmp_path / "values.json")})],
        env=playbook_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, output
    return json.loads((tmp_path / "values.json").read_text()), output


@pytest.mark.parametrize(
    ("given", "expected", "warned"),
    [
        ({}, {"env_lock": None, "wait": 0, "stale_after": 1800, "break": False}, []),
        (
            {"dflash_lock": LOCK, "dflash_lock_wait": 7, "dflash_lock_stale_after": 60,
             "dflash_lock_break": True},
            {"env_lock": LOCK, "wait": 7, "stale_after": 60, "break": True},
            ["dflash_lock", "dflash_lock_wait", "dflash_lock_stale_after", "dflash_lock_break"],
        ),
        (
            {"dflash_lock_wait": 7, "dflash_deploy_lock_wait": 9},
            {"env_lock": None, "wait": 9, "stale_after": 1800, "break": False},
            ["dflash_lock_wait"],
        ),
    ],
    ids=["new-defaults", "old-names-read", "new-name-wins"],
)  # fmt: skip
def test_old_names_still_work_with_a_warning(tmp_path, given, expected, warned):
    values, output = run(tmp_path, given)
    assert values == expected
    new = {
        "dflash_lock": "dflash_env_lock",
        "dflash_lock_wait": "dflash_deploy_lock_wait",
        "dflash_lock_stale_after": "dflash_deploy_lock_stale_after",
        "dflash_lock_break": "dflash_deploy_lock_break",
    }
    for old, renamed in new.items():
        said = f"[WARNING]: {old} is renamed {renamed}: the old name still works" in output
        assert said == (old in warned), old
    assert ("dflash_deploy_lock_wait is set too, and wins" in output) == (
        "dflash_deploy_lock_wait" in given
    )
