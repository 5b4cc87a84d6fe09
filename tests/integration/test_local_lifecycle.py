"""deploy -> verify -> rollback on the embedded local target, through real ansible-playbook runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from tests.helpers import REPO, playbook_command, playbook_env

V1 = {"dflash/__init__.py": "VERSION = 1\n", "dflash/train.py": "print('one')\n"}
V2 = {"dflash/__init__.py": "VERSION = 2\n", "dflash/train.py": "print('two')\n"}


def current_of(root: Path) -> str:
    return os.readlink(root / "current")


def history_of(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def test_deploy_redeploy_drift_and_rollback(source_repo, playbook, target_root, tmp_path):
    source_repo("v1", V1)
    repo = source_repo("v2", V2)

    first = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1")
    assert first.rc == 0, first.output
    assert first.changed() > 0
    assert current_of(target_root) == "releases/v1"
    manifest = json.loads((target_root / "current" / "MANIFEST.json").read_text())
    assert manifest["release"] == "v1" and manifest["ref"] == "v1" and not manifest["dirty"]
    assert set(manifest["files"]) == set(V1)

    again = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1")
    assert again.rc == 0, again.output
    assert again.changed() == 0, again.output

    second = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v2")
    assert second.rc == 0, second.output
    assert current_of(target_root) == "releases/v2"

    clean = playbook("verify.yml")
    assert clean.rc == 0, clean.output
    assert clean.report["hosts"]["local"]["verdict"] == "ok"

    (target_root / "current" / "dflash" / "train.py").write_text("print('hot fix')\n")
    drift = playbook("verify.yml")
    assert drift.rc != 0
    findings = drift.report["hosts"]["local"]["findings"]
    assert [(f["kind"], f["path"], f["state"]) for f in findings] == [
        ("code", "dflash/train.py", "changed")
    ]
    assert "dflash/train.py" in drift.output
    # The JUnit report next to the JSON one: the host fails, naming the finding.
    junit = ElementTree.parse(tmp_path / "reports" / "verify.junit.xml").getroot()
    assert (junit.get("tests"), junit.get("failures"), junit.get("errors")) == ("1", "1", "0")
    [failure] = junit.iter("failure")
    assert failure.get("message") == "1 finding(s): code"
    assert "code dflash/train.py: expected content as in the manifest" in failure.text

    back = playbook("rollback.yml", dflash_source_dir=str(repo))
    assert back.rc == 0, back.output
    assert current_of(target_root) == "releases/v1"
    after = playbook("verify.yml")
    assert after.rc == 0, after.output

    entries = history_of(target_root)
    assert [(e["action"], e["release"], e["previous"]) for e in entries] == [
        ("deploy", "v1", None),
        ("deploy", "v2", "v1"),
        ("rollback", "v1", "v2"),
    ]
    assert all(e["tree_sha256"] and e["controller"]["user"] for e in entries)


def test_working_tree_release_is_marked_dirty(source_repo, playbook, target_root):
    repo = source_repo("v1", V1)
    (repo / "dflash" / "train.py").write_text("print('uncommitted')\n")
    (repo / "dflash" / "new.py").write_text("NEW = True\n")

    run = playbook("deploy.yml", dflash_source_dir=str(repo))
    assert run.rc == 0, run.output
    manifest = json.loads((target_root / "current" / "MANIFEST.json").read_text())
    assert manifest["dirty"] is True
    assert manifest["release"] == "wt-" + manifest["tree_sha256"][:12]
    assert "dflash/new.py" in manifest["files"]
    assert (target_root / "current" / "dflash" / "train.py").read_text() == "print('uncommitted')\n"


def test_check_mode_changes_nothing(source_repo, playbook, target_root):
    source_repo("v1", V1)
    repo = source_repo("v2", V2)
    args = {"target_model": "tiny", "lr": "0.0003"}
    deploy = lambda ref, **kw: playbook(  # noqa: E731
        "deploy.yml", dflash_source_dir=str(repo), dflash_ref=ref, **{
            "dflash_trainer_args": args, **kw})  # fmt: skip
    assert deploy("v1").rc == 0
    before = sorted(p.name for p in (target_root / "releases").iterdir())
    run_sh = (target_root / "run.sh").read_bytes()

    same = deploy("v1", _check=True)
    assert same.rc == 0 and same.changed() == 0, same.output

    dry = deploy("v2", _check=True)
    assert dry.rc == 0, dry.output
    assert dry.changed() > 0, "check mode must say that a deploy of v2 would change things"
    # --diff names the switch it would make.
    assert "-current -> v1" in dry.output and "+current -> v2" in dry.output

    # A trainer flag changed in the inventory: --diff shows run.sh's line with the old and the
    # new value, and nothing else of run.sh.
    lr = deploy("v1", dflash_trainer_args={**args, "lr": "0.0001"}, _check=True)
    assert lr.rc == 0 and lr.changed() > 0, lr.output
    diff = [line for line in lr.output.splitlines() if line.startswith(("-  ", "+  "))]
    assert diff == ["-  --lr 0.0003 \\", "+  --lr 0.0001 \\"], lr.output
    assert f"--- before: {target_root}/run.sh" in lr.output

    assert (target_root / "run.sh").read_bytes() == run_sh
    assert current_of(target_root) == "releases/v1"
    assert sorted(p.name for p in (target_root / "releases").iterdir()) == before
    assert len(history_of(target_root)) == 1


def test_current_is_never_dangling_during_a_deploy(source_repo, playbook, target_root):
    source_repo("v1", V1)
    repo = source_repo("v2", V2)
    assert playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1").rc == 0

    seen_broken: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if not (target_root / "current" / "MANIFEST.json").is_file():
                seen_broken.append(os.readlink(target_root / "current"))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v2")
    finally:
        done.set()
        watcher.join()
    assert run.rc == 0, run.output
    assert seen_broken == []


def test_deploy_killed_between_unpack_and_switch(source_repo, playbook, target_root, tmp_path):
    """SIGKILL the whole deploy as soon as the new release is unpacked: current must still point
    at the old release, verify must pass, and the next deploy must finish the job."""
    source_repo("v1", V1)
    repo = source_repo("v2", V2)
    assert playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1").rc == 0

    cmd = playbook_command(
        "deploy.yml",
        {"dflash_root": str(target_root), "dflash_source_dir": str(repo), "dflash_ref": "v2"},
    )
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=playbook_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    unpacked = target_root / "releases" / "v2" / "MANIFEST.json"
    deadline = time.monotonic() + 120
    while not unpacked.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert unpacked.exists(), "the deploy never got as far as unpacking v2"
    assert current_of(target_root) == "releases/v1"

    # A killed unpack leaves a temp folder behind: it must not count as a release.
    partial = target_root / "releases" / ".tmp-v3-12345"
    (partial / "dflash").mkdir(parents=True)
    (partial / "dflash" / "half.py").write_text("")

    # verify names the interrupted deploy (its lock was left behind), and nothing else.
    report_path = tmp_path / "reports" / "verify.json"
    interrupted = playbook("verify.yml")
    host = json.loads(report_path.read_text())["hosts"]["local"]
    assert interrupted.rc != 0 and host["release"] == "v1", interrupted.output
    assert [(f["kind"], f.get("state")) for f in host["findings"]] == [("release", "interrupted")]
    assert "deploy of v2" in host["findings"][0]["found"]

    finish = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v2")
    assert finish.rc == 0, finish.output
    assert "took over the deploy lock" in finish.text
    assert current_of(target_root) == "releases/v2"
    assert playbook("verify.yml").rc == 0


def test_keep_n_never_prunes_current_or_rollback_target(source_repo, playbook, target_root):
    for tag in ("v1", "v2", "v3"):
        repo = source_repo(tag, {"dflash/__init__.py": f"VERSION = '{tag}'\n"})
    for tag in ("v1", "v2"):
        assert playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref=tag).rc == 0
    assert playbook("rollback.yml", dflash_source_dir=str(repo)).rc == 0  # back to v1
    assert current_of(target_root) == "releases/v1"

    run = playbook(
        "deploy.yml", dflash_source_dir=str(repo), dflash_ref="v3", dflash_keep_releases=1
    )
    assert run.rc == 0, run.output
    # v3 is current; v1 is the deployment before it (the rollback target); v2 goes.
    assert sorted(p.name for p in (target_root / "releases").iterdir()) == ["v1", "v3"]

    default_back = playbook("rollback.yml", dflash_source_dir=str(repo))
    assert default_back.rc == 0, default_back.output
    assert current_of(target_root) == "releases/v1"

    # v2 was pruned from the target; a rollback to its tag rebuilds it from the checkout.
    pruned_back = playbook("rollback.yml", dflash_source_dir=str(repo), dflash_release="v2")
    assert pruned_back.rc == 0, pruned_back.output
    assert current_of(target_root) == "releases/v2"
    assert playbook("verify.yml").rc == 0
