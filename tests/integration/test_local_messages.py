"""Messages that must be true (issue 31): a fix hint restores what history recorded (never the
controller's working tree), a trainer stopped on purpose is `stopped` (not drift), and a deploy
after a rollback says what it replaces before it changes anything."""

from __future__ import annotations

import json
import os
import re
import subprocess

from tests.helpers import build_wheel
from tests.integration.conftest import TRAINER_ARGS, add_release, alive, read_json
from tests.integration.test_local_verify import env_pip

LAUNCH = {"dflash_launch": True, "dflash_trainer_args": TRAINER_ARGS, "dflash_health_timeout": 180}


def run_hint(playbook, hint: str, **extravars):
    """Run the `ansible-playbook <book> -e name=value ...` command a hint names, as written."""
    words = hint.split()
    assert words[0] == "ansible-playbook", hint
    named = dict(word.split("=", 1) for word in words[2:] if word != "-e")
    assert all(value for value in named.values()), f"a hint without a value: {hint}"
    return playbook(words[1], **named, **extravars)


def test_after_a_rollback_every_hint_keeps_the_rolled_back_release(
    deploy, trainer_repo, playbook, target_root, tmp_path
):
    source = {"dflash_source_dir": str(trainer_repo)}
    assert deploy("v1").rc == 0
    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2\n")
    assert deploy("v2").rc == 0
    back = playbook("rollback.yml", dflash_release="v1", **source, **LAUNCH)
    assert back.rc == 0, back.output
    # It names the deployment it puts back (history's #1) and its settings, before it acts.
    flat = " ".join(back.output.split())
    assert "Rolling back to deployment #1 of history (deploy of v1 at " in flat, back.output
    assert "data self-generated, GPUs cpu, flags --checkpoint-every 1000 " in flat
    assert "Its settings are those of the current deployment." in flat

    # Stopped on purpose: its own verdict, exit 0, the metric says so, the hint starts v1.
    assert playbook("playbooks/stop.yml").rc == 0
    stopped = playbook("verify.yml", **LAUNCH)
    assert stopped.rc == 0, stopped.output
    host = stopped.report["hosts"]["local"]
    assert (host["verdict"], host["findings"]) == ("stopped", [])
    metrics = (tmp_path / "reports" / "verify.prom").read_text()
    assert 'dflash_verify_verdict{host="local",verdict="stopped"} 1.0' in metrics
    said = re.search(r"STOPPED: .*? Start it again as recorded: (ansible-playbook \S+ -e [^\s']+)",
                     stopped.text)  # fmt: skip
    assert said, stopped.text
    hint = said.group(1)
    assert hint == "ansible-playbook rollback.yml -e dflash_release=v1", said.group(0)
    again = run_hint(playbook, hint, **source, **LAUNCH)
    assert again.rc == 0, again.output
    assert (target_root / "current").resolve().name == "v1"
    assert alive(read_json(target_root / "trainer.json")["pid"])

    # A plain deploy (the working tree) says, before any change, that it replaces v1.
    plain = playbook("deploy.yml", _check=True, **source, **LAUNCH)
    assert plain.rc == 0, plain.output
    assert "(this replaces v1, which rollback.yml put back at " in plain.text
    assert f"with the working tree of {trainer_repo})" in plain.text
    # One reason per fact: a release that is not on the target is not also "another tree".
    assert "holds another tree" not in plain.text

    # Code edited on the target: the hint rebuilds v1 from its tag, not the working tree.
    edited = target_root / "current" / "dflash" / "train.py"
    edited.write_text(edited.read_text() + "\n# hot fix\n")
    drift = playbook("verify.yml", **LAUNCH)
    [code] = [f for f in drift.report["hosts"]["local"]["findings"] if f["kind"] == "code"]
    hint = code["hint"].split(": ", 1)[1]
    assert hint == "ansible-playbook deploy.yml -e dflash_ref=v1", code
    fixed = run_hint(playbook, hint, **source, **LAUNCH)
    assert fixed.rc == 0, fixed.output
    assert "# hot fix" not in edited.read_text()
    assert (target_root / "current").resolve().name == "v1"


def history_lines(root) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def test_repairs_write_history_and_check_mode_names_the_same_reasons(
    deploy, playbook, target_root, tmp_path
):
    """Hand drift repaired by a plain redeploy of the same release: --check first, then the
    real run. Both give the same reasons, the launch does in the real run what --check said
    it would, and each repair has its history line saying what it repaired."""
    assert deploy("v1").rc == 0
    pid = read_json(target_root / "trainer.json")["pid"]

    # run.sh edited by hand: rendered again; the trainer started from the recorded run.sh runs on.
    run_sh = target_root / "run.sh"
    run_sh.write_text(
        run_sh.read_text().replace("set -euo pipefail", "set -euo pipefail\nexport BY_HAND=1", 1)
    )
    before = len(history_lines(target_root))
    check = deploy("v1", _check=True)
    assert check.rc == 0, check.output
    real = deploy("v1")
    assert real.rc == 0, real.output
    [line] = history_lines(target_root)[before:]
    assert line["repaired"] == ["run.sh on the target differs from the one this deploy renders"]
    for reason in line["why"]:
        assert reason in check.text, (reason, check.text)
    # What the launch does, the same in --check as in the real run.
    kept = f"already running (pid {pid}), not restarted"
    assert kept in real.text and kept in check.text, check.text
    said = [line for line in check.output.splitlines()
            if "would" in line and "start" in line and not line.startswith("TASK [")]  # fmt: skip
    assert not said, said
    assert read_json(target_root / "trainer.json")["pid"] == pid

    # A package installed into the env by hand: the env is rebuilt, a line says so.
    build_wheel(tmp_path, "dflashtest-probe", "9.9")
    pip = env_pip(target_root)
    subprocess.run([*pip, "install", "-q", "--no-index", "--no-deps", "--find-links",
                    str(tmp_path), "dflashtest-probe==9.9"], check=True,
                   env=dict(os.environ, PIP_CONFIG_FILE=os.devnull))  # fmt: skip
    drift = playbook("verify.yml", **LAUNCH)
    [env] = [f for f in drift.report["hosts"]["local"]["findings"] if f["kind"] == "environment"]
    assert env["expected"] == "dflashtest-probe (not in the lock)", env
    assert env["found"] == "dflashtest-probe==9.9", env
    before = len(history_lines(target_root))
    check = deploy("v1", _check=True)
    real = deploy("v1")
    assert real.rc == 0, real.output
    new_lines = history_lines(target_root)[before:]
    assert len(new_lines) == 1, new_lines
    [line] = new_lines
    assert any("has drifted from its lock" in why for why in line["repaired"]), line
    for reason in line["why"]:
        assert reason in check.text, (reason, check.text)
    listed = playbook("history.yml")
    assert "repaired: run.sh on the target differs" in listed.text
    assert "has drifted from its lock" in listed.text
