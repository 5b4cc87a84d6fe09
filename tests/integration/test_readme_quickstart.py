"""The README's Quick start, typed into a shell of a fresh clone as it is written.

A new user found that its commands did not run (`ansible-playbook: command not found`): this
runs every line of the Quick start's `sh` blocks in order, each in `sh` from the clone's root
after the lines before it, with a PATH that holds no venv of its own. What would start a
trainer or rebuild the venv is run as far as it can be without that:

- `make <target>` runs as `make -n <target>` (the target exists and its recipe expands; the
  venv is this checkout's, linked into the clone, and a demo or test run is the rest of the
  suite's business);
- `ansible-playbook deploy.yml` runs with `--check` (every check and the one read of the target,
  nothing changed), against an empty `sandbox/` (a check-mode deploy of a root that does not
  exist yet stops at the switch of `current`: "state root ... does not exist; deploy first");
- every other line runs as written: `. .venv/bin/activate`, verify.yml (exit status 2: the
  clone's target has nothing deployed), history.yml, playbooks/stop.yml.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.unit.test_docs_readme import commands, quick_start, sh_blocks

pytestmark = pytest.mark.slow


def user_shell_env() -> dict[str, str]:
    """A user's shell: no venv on PATH, no Ansible settings of the test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if ".venv" not in p
    )
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def as_run(words: list[str]) -> str:
    if words[0] == "make":
        return shlex.join(["make", "-n", *words[1:]])
    if words[0] == "ansible-playbook" and "deploy.yml" in words:
        return shlex.join([*words, "--check"])
    return shlex.join(words)


@pytest.fixture
def clone(tmp_path: Path, local_wheelhouse: Path) -> Path:
    """A fresh clone of this checkout, with its venv (`make venv` done) and the demo's
    wheelhouse (`playbooks/wheelhouse.yml` done) linked in."""
    if not (REPO / ".venv" / "bin" / "activate").is_file():
        pytest.skip("no .venv in the checkout: run make venv")
    path = tmp_path / "dflash-deploy"
    subprocess.run(["git", "clone", "-q", str(REPO), str(path)], check=True, timeout=120)
    (path / ".venv").symlink_to(REPO / ".venv")
    (path / ".build").mkdir()
    (path / ".build" / "wheelhouse").symlink_to(local_wheelhouse)
    return path


def test_the_quick_start_runs_as_written_in_a_fresh_clone(clone: Path):
    lines = [w for block in sh_blocks(quick_start()) for w in commands(block)]
    assert lines, "the README has no Quick start sh block"
    env = user_shell_env()
    done: list[str] = []
    (clone / "sandbox").mkdir()
    for words in lines:
        line = as_run(words)
        script = "\n".join([*(d for d in done if d.startswith(". ")), line])
        proc = subprocess.run(
            ["sh", "-c", f"set -e\n{script}"], cwd=clone, env=env, capture_output=True,
            text=True, timeout=300, check=False,
        )  # fmt: skip
        output = proc.stdout + proc.stderr
        # bash says "command not found", dash "sh: 1: ansible-playbook: not found".
        assert not re.search(r"command not found|: not found$", output, re.MULTILINE), (
            line,
            output[-3000:],
        )
        expected = (0, 2) if words[:2] == ["ansible-playbook", "verify.yml"] else (0,)
        assert proc.returncode in expected, (line, proc.returncode, output[-3000:])
        done.append(line)
        if words == [".", ".venv/bin/activate"]:
            found = subprocess.run(
                ["sh", "-c", ". .venv/bin/activate && command -v ansible-playbook"], cwd=clone,
                env=env, capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            assert Path(found).resolve() == (REPO / ".venv/bin/ansible-playbook").resolve()
        if words[:2] == ["ansible-playbook", "verify.yml"]:
            report = json.loads((clone / "reports" / "verify.json").read_text())
            assert report["hosts"]["local"]["verdict"] in ("ok", "drift"), report
        if words[:2] == ["ansible-playbook", "deploy.yml"]:
            assert "failed=0" in output, output[-3000:]
    ran = [d for d in done if not d.startswith("make -n")]
    assert ". .venv/bin/activate" in ran and any(d.startswith("ansible-playbook") for d in ran)
