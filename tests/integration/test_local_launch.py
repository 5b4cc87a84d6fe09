"""The launch step on the local target with the real trainer: one healthy trainer, strays and
SIGTERM-deaf processes stopped, a crashing release replaced by the previous one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from tests.integration.conftest import (
    TRAINER_ARGS,
    add_release,
    alive,
    parent_of,
    read_json,
    status_of,
)


def test_healthy_launch_no_restart_then_clean_switch(deploy, playbook, trainer_repo, target_root):
    first = deploy("v1")
    assert first.rc == 0, first.output
    record = read_json(target_root / "trainer.json")
    status = status_of(target_root)
    manifest = read_json(target_root / "current" / "MANIFEST.json")
    assert status["state"] == "running" and status["step"] >= 1
    assert status["code_tree_sha256"] == manifest["tree_sha256"]
    # trainer.json names run.sh's process, the supervisor; the trainer is its child.
    assert parent_of(status["pid"]) == record["pid"] and alive(record["pid"])
    assert "tokens/s" in first.output
    # The record gave the deploy lock up in its own call; the play's release had nothing to do.
    assert not (target_root / ".deploy.lock").exists()
    assert re.search(r"Release the deploy lock\][^\n]*\*+\n+skipping: \[local\]", first.output)

    taken = (target_root / ".deploy.generation").read_text()
    again = deploy("v1")
    assert again.rc == 0 and again.changed() == 0, again.output
    assert read_json(target_root / "trainer.json")["pid"] == record["pid"]
    # One read of the target, before the deploy lock, decided it: the host ended there, the lock
    # was not taken (its count of takes is unchanged) and no step was included.
    assert "Nothing to change on local" in " ".join(again.output.split()), again.output
    assert (target_root / ".deploy.generation").read_text() == taken
    steps = ("dflash_deploy_lock : Take", "Deploy what changes", "dflash_activate : Make",
             "dflash_runscript : Render run.sh]", "dflash_launch : Check")  # fmt: skip
    for step in steps:
        assert f"TASK [{step}" not in again.output, step

    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2\n")
    # --check says what the real run does next: restart, not "already running".
    dry = deploy("v2", _check=True)
    flat = " ".join(dry.output.split())
    assert dry.rc == 0 and "would restart the trainer of release v2" in flat, dry.output
    assert "already running" not in flat and read_json(target_root / "trainer.json") == record
    second = deploy("v2")
    assert second.rc == 0, second.output
    new = read_json(target_root / "trainer.json")
    assert new["pid"] != record["pid"] and not alive(record["pid"])
    assert new["run_id"] != record["run_id"]
    new_log = (target_root / "runs" / new["run_id"] / "train.log").read_text()
    assert record["run_id"] not in new_log and new["run_id"] in new_log
    # The old trainer checkpointed on SIGTERM; the checkpoint folder survived the restart.
    assert list((target_root / "checkpoints").glob("*.pt"))
    history = [json.loads(x) for x in (target_root / "history.jsonl").read_text().splitlines()]
    assert [(e["release"], e["result"]) for e in history] == [("v1", "healthy"), ("v2", "healthy")]
    assert history[-1]["run_id"] == new["run_id"] and history[-1]["tokens_per_s"]
    assert history[-1]["run_sh_sha256"] and "dflash.train" in history[-1]["run_sh_text"]

    # v3 staged (not launched: v2's trainer trains on), then a rollback to v2: its run is
    # adopted, not restarted, and the rollback is a line of its own (verify agrees).
    add_release(trainer_repo, "v3", "dflash/__init__.py", "# v3\n")
    assert deploy("v3", dflash_launch=False).rc == 0
    back = playbook("rollback.yml", dflash_release="v2", dflash_launch=True)
    assert back.rc == 0, back.output
    assert read_json(target_root / "trainer.json")["run_id"] == new["run_id"]
    history = [json.loads(x) for x in (target_root / "history.jsonl").read_text().splitlines()]
    assert [(e["action"], e["release"]) for e in history[-2:]] == [
        ("deploy", "v3"), ("rollback", "v2")
    ]  # fmt: skip
    assert history[-1]["run_id"] == new["run_id"]
    verify = playbook("verify.yml")
    assert verify.rc == 0 and verify.report["hosts"]["local"]["verdict"] == "ok", verify.output

    # Another trainer flag: the deploy's steps run, saying why in the flag's terms (not "run.sh
    # differs"), and the trainer is restarted.
    other = deploy("v2", dflash_trainer_args={**TRAINER_ARGS, "checkpoint_every": 40})
    flat = " ".join(other.output.split())
    assert other.rc == 0 and "- 'trainer flag --checkpoint-every: 1000 -> 40'" in flat, flat
    assert "run.sh on the target differs" not in flat
    assert read_json(target_root / "trainer.json")["run_id"] != new["run_id"]


def test_stray_and_sigterm_deaf_trainers_are_stopped(deploy, target_root):
    assert deploy("v1").rc == 0
    env_python = next((target_root / "envs").glob("*/bin/python"))
    # A stray started by hand from the release folder, without run.sh's marker.
    stray = subprocess.Popen(
        [str(env_python), "-m", "dflash.train", "--target-model", "tiny", "--max-steps",
         "100000", "--checkpoint-dir", str(target_root / "stray-ck"),
         "--status-file", str(target_root / "stray-status.json")],
        cwd=os.path.realpath(target_root / "current"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    # A process carrying the marker that ignores SIGTERM.
    deaf = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        env=dict(os.environ, DFLASH_ROOT=os.path.realpath(target_root)),
    )  # fmt: skip
    time.sleep(1)
    try:
        run = deploy("v1", dflash_restart=True, dflash_stop_timeout=3)
        assert run.rc == 0, run.output
        assert stray.wait(timeout=30) is not None
        assert deaf.wait(timeout=30) == -signal.SIGKILL
        flat = " ".join(run.output.split())
        assert "killed" in flat and str(deaf.pid) in flat
        record = read_json(target_root / "trainer.json")
        assert alive(record["pid"]) and status_of(target_root)["state"] == "running"
    finally:
        for proc in (stray, deaf):
            if proc.poll() is None:
                proc.kill()


def test_crash_at_start_puts_the_previous_release_back(deploy, trainer_repo, target_root):
    add_release(trainer_repo, "v0", "dflash/__init__.py", "\n# v0\n")
    assert deploy("v0", dflash_launch=False).rc == 0  # staged: the deployment before v1
    assert deploy("v1").rc == 0
    good = read_json(target_root / "trainer.json")
    # The crash is in a module the trainer imports but the flags check does not: a release
    # whose package does not import at all is refused before any change (the bad-input tests).
    add_release(
        trainer_repo, "crash", "dflash/options.py",
        "\nraise RuntimeError('boom: this release cannot start')\n",
    )  # fmt: skip
    run = deploy("crash", dflash_keep_releases=1)
    assert run.rc != 0
    flat = " ".join(run.output.split())
    assert "boom: this release cannot start" in flat, "the log tail is missing"
    # The real way it ended, never a "state None".
    assert "the trainer failed at start (exited with code 1; " in flat, run.output
    assert "state None" not in flat
    assert "Release v1 is current again and its trainer runs" in flat, run.output
    assert os.readlink(target_root / "current") == "releases/v1"
    back = read_json(target_root / "trainer.json")
    assert back["pid"] != good["pid"] and alive(back["pid"])
    manifest = read_json(target_root / "current" / "MANIFEST.json")
    deadline = time.monotonic() + 60
    while status_of(target_root).get("step", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status_of(target_root)["code_tree_sha256"] == manifest["tree_sha256"]
    history = [json.loads(x) for x in (target_root / "history.jsonl").read_text().splitlines()]
    failed, restored = history[-2:]
    assert failed["release"] == "crash" and failed["result"] == "rolled_back"
    assert "boom" in failed["error"] and failed["rolled_back_to"] == "v1"
    assert (restored["action"], restored["release"], restored["result"]) == (
        "rollback", "v1", "healthy"
    )  # fmt: skip
    assert restored["run_id"] == back["run_id"]
    # keep 1: v1 is current again, v0 is rollback.yml's default target, the crash stays for
    # diff.yml until the next deploy; nothing of them was pruned.
    assert sorted(p.name for p in (target_root / "releases").iterdir()) == ["crash", "v0", "v1"]
    assert restored["controller"]["user"] and failed["controller"]["user"]
