"""Every drift the field has been bitten by, provoked for real on the local target and named by
verify.yml with what was expected and what was found."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import build_wheel
from tests.integration.conftest import add_release, read_json, status_of


def kinds(run) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for item in run.report["hosts"]["local"]["findings"]:
        found.setdefault(item["kind"], []).append(item)
    return found


def env_pip(root: Path) -> list[str]:
    env_python = next((root / "envs").glob("*/bin/python"))
    pip_wheel = next((Path(__file__).resolve().parents[2] / ".build" / "wheelhouse").glob("pip-*"))
    return [str(env_python), f"{pip_wheel}/pip"]


def test_each_drift_is_found_and_named(deploy, trainer_repo, playbook, target_root, tmp_path):
    assert deploy("v1").rc == 0
    verify = lambda **kw: playbook("verify.yml", **kw)  # noqa: E731
    clean = verify()
    assert clean.rc == 0, clean.output
    assert clean.report["hosts"]["local"]["verdict"] == "ok"

    # code: a deployed file edited by hand
    train_py = target_root / "current" / "dflash" / "train.py"
    original = train_py.read_text()
    train_py.write_text(original + "\n# hot fix\n")
    found = kinds(verify())
    assert [f["path"] for f in found["code"]] == ["dflash/train.py"]
    train_py.write_text(original)

    # run_script: run.sh edited by hand
    run_sh = target_root / "run.sh"
    script = run_sh.read_text()
    run_sh.write_text(script.replace("--target-model", "--lr 1 --target-model"))
    [item] = kinds(verify())["run_script"]
    assert item["found"] != item["expected"]
    run_sh.write_text(script)

    # environment: another package version installed into the env by hand
    build_wheel(tmp_path, "dflashtest-probe", "9.9")
    pip = env_pip(target_root)
    install = [*pip, "install", "-q", "--no-index", "--no-deps", "--find-links", str(tmp_path)]
    subprocess.run([*install, "dflashtest-probe==9.9"], check=True,
                   env=dict(os.environ, PIP_CONFIG_FILE=os.devnull))  # fmt: skip
    [item] = kinds(verify())["environment"]
    assert item["package"] == "dflashtest-probe" and item["found"] == "dflashtest-probe==9.9"
    subprocess.run([*pip, "uninstall", "-q", "-y", "dflashtest-probe"], check=True)

    # cache: a cache built by another torch put in place
    [cache_dir] = (target_root / "cache").iterdir()
    (cache_dir / "built-by.json").write_text(
        json.dumps({"torch": "2.11.0+cu130", "tree_sha256": "0" * 64})
    )
    [item] = kinds(verify())["cache"]
    assert "2.11.0+cu130" in item["found"]
    (cache_dir / "built-by.json").unlink()

    # duplicate_trainer: a second trainer started by hand through run.sh
    second = subprocess.Popen(
        ["bash", str(run_sh)], env=dict(os.environ, DFLASH_RUN_ID="by-hand"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        [item] = kinds(verify())["duplicate_trainer"]
        assert second.pid in item["pids"]
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()

    # heartbeat_stale: the trainer frozen (SIGSTOP), so its status.json stops moving (its
    # supervisor, trainer.json's pid, restarts it only after the hang limit: 300 s here)
    pid = read_json(target_root / "trainer.json")["pid"]
    trainer = status_of(target_root)["pid"]
    os.kill(trainer, signal.SIGSTOP)
    try:
        time.sleep(4)
        [item] = kinds(verify(dflash_heartbeat_max_age=2))["heartbeat_stale"]
        assert item["pid"] == pid
    finally:
        os.kill(trainer, signal.SIGCONT)

    # stale_process: current switched to v2 while the v1 trainer keeps running
    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2\n")
    assert deploy("v2", dflash_launch=False).rc == 0
    found = kinds(verify())
    [item] = found["stale_process"]
    assert item["pid"] == pid and "v1" in item["found"]

    # not_running: the trainer killed
    assert deploy("v2").rc == 0
    new_pid = read_json(target_root / "trainer.json")["pid"]
    os.killpg(new_pid, signal.SIGKILL)
    time.sleep(1)
    [item] = kinds(verify())["not_running"]
    assert "v2" in item["expected"]
    assert "read runs/latest/train.log" in item["hint"]
    assert item["hint"].endswith("ansible-playbook rollback.yml -e dflash_release=v2"), item
    # Stopped on purpose by stop.yml: the `stopped` verdict, no finding, exit 0.
    assert deploy("v2").rc == 0
    stop = playbook("playbooks/stop.yml")
    assert stop.rc == 0, stop.output
    run = verify()
    assert run.rc == 0, run.output
    assert run.report["hosts"]["local"]["verdict"] == "stopped"
    assert not run.report["hosts"]["local"]["findings"]
    assert "STOPPED: the trainer of release v2 was stopped on purpose by playbooks/stop.yml" in (
        run.text
    )
