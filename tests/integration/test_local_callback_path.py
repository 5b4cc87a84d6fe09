"""A user's own ANSIBLE_CALLBACK_PLUGINS (for ARA, profile_tasks, a callback of their own)
replaces ansible.cfg's callback_plugins: every playbook, at the top and under playbooks/, must
still find the toolkit's stdout callback, and the user's callback must run beside it. The same
for a user's ANSIBLE_COLLECTIONS_PATH and the toolkit's shared code."""

from __future__ import annotations

from pathlib import Path

import pytest

USER_CALLBACK = """
import os
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "user_marker"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_stats(self, stats):
        with open(os.environ["USER_MARKER"], "a") as out:
            out.write("ran\\n")
"""


@pytest.mark.parametrize("name", ["history.yml", "playbooks/history.yml", "playbooks/stop.yml"])
def test_a_users_callback_path_keeps_the_toolkits_output(playbook, tmp_path: Path, name: str):
    folder = tmp_path / "callbacks"
    folder.mkdir()
    (folder / "user_marker.py").write_text(USER_CALLBACK)
    marker = tmp_path / "marker"
    env = {
        "ANSIBLE_CALLBACK_PLUGINS": str(folder),
        "ANSIBLE_CALLBACKS_ENABLED": "user_marker",
        "USER_MARKER": str(marker),
    }
    run = playbook(name, _env=env)
    # ansible.cfg's stdout_callback is dflash: one that cannot be loaded ends the run at once
    # ("Could not load 'dflash' callback plugin", rc 1, before any task).
    assert run.rc == 0, run.output
    assert "Could not load" not in run.output and "PLAY RECAP" in run.output
    assert marker.read_text() == "ran\n"


@pytest.mark.parametrize("name", ["history.yml", "playbooks/stop.yml"])
def test_a_users_collections_path_keeps_the_toolkits_shared_code(
    playbook, tmp_path: Path, name: str
):
    # ANSIBLE_COLLECTIONS_PATH replaces ansible.cfg's collections_path, which names the
    # collection dflash.deploy whose module_utils every filter and module imports; the
    # editable install's sys.path entry still finds it (pyproject.toml).
    (tmp_path / "collections").mkdir()
    run = playbook(name, _env={"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections")})
    assert run.rc == 0, run.output
    assert "PLAY RECAP" in run.output
