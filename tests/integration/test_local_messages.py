"""Messages that must be true (issue 31): a fix hint restores what history recorded (never the
controller's working tree), a trainer stopped on purpose is `stopped` (not drift), and a deploy
after a rollback says what it replaces before it changes anything."""

from __future__ import annotations

from tests.integration.conftest import TRAINER_ARGS, add_release, alive, read_json

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

    # Stopped on purpose: its own verdict, exit 0, the metric says so, the hint starts v1.
    assert playbook("playbooks/stop.yml").rc == 0
    stopped = playbook("verify.yml", **LAUNCH)
    assert stopped.rc == 0, stopped.output
    host = stopped.report["hosts"]["local"]
    assert (host["verdict"], host["findings"]) == ("stopped", [])
    metrics = (tmp_path / "reports" / "verify.prom").read_text()
    assert 'dflash_verify_verdict{host="local",verdict="stopped"} 1.0' in metrics
    line = next(t for t in stopped.text.splitlines() if "STOPPED:" in t)
    hint = line.split("Start it again as recorded: ", 1)[1].split("'")[0].split('"')[0].strip()
    assert hint == "ansible-playbook rollback.yml -e dflash_release=v1", line
    again = run_hint(playbook, hint, **source, **LAUNCH)
    assert again.rc == 0, again.output
    assert (target_root / "current").resolve().name == "v1"
    assert alive(read_json(target_root / "trainer.json")["pid"])

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

    # A plain deploy (the working tree) says, before any change, that it replaces v1.
    plain = playbook("deploy.yml", _check=True, **source, **LAUNCH)
    assert plain.rc == 0, plain.output
    assert "(this replaces v1, which rollback.yml put back at " in plain.text
    assert f"with the working tree of {trainer_repo})" in plain.text
    # One reason per fact: a release that is not on the target is not also "another tree".
    assert "holds another tree" not in plain.text
