"""The health gate of deploy.yml on the local target: a release that trains too slowly is
rolled back automatically (code, env and run.sh as that deployment recorded them), history
says what happened, and diff.yml names what made it slow."""

from __future__ import annotations

import json
import os
import time

from tests.helpers import record_tokens_per_s
from tests.integration.conftest import (
    IDLE_STEP_S,
    TRAINER_ARGS,
    add_release,
    alive,
    read_json,
    status_of,
)

# The slow release sleeps 2 s after each step of at most 128 tokens (TRAINER_ARGS): at most
# 64 tokens/s on any machine. The reference is set to 10x that, so the gate (0.5) must fire
# however fast or loaded the machine is; a measured reference would make the outcome depend on
# the load.
SLOW_BOUND = TRAINER_ARGS["token_budget"] / 2.0
REFERENCE = 10 * SLOW_BOUND


def history_of(root) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def wait_for_step(root, step: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while status_of(root).get("step", 0) < step and time.monotonic() < deadline:
        time.sleep(0.5)
    return status_of(root)


def test_slow_release_is_rolled_back_by_the_throughput_gate(
    deploy, trainer_repo, target_root, playbook, tmp_path
):
    assert deploy("v1", dflash_keep_releases=1).rc == 0
    good_run_sh = (target_root / "run.sh").read_text()
    assert history_of(target_root)[-1]["tokens_per_s"] > 0
    record_tokens_per_s(target_root, "v1", REFERENCE)

    # v2: a changed file, and a trainer flag that sleeps 2 s after every step.
    add_release(trainer_repo, "v2", "dflash/__init__.py", "\n# v2\n")
    slow = deploy(
        "v2", dflash_keep_releases=1, dflash_trainer_args=dict(TRAINER_ARGS, sleep_per_step=2.0),
        dflash_min_throughput_ratio=0.5,
    )  # fmt: skip
    assert slow.rc != 0
    flat = " ".join(slow.output.split())
    assert "Release v2 failed its health check" in flat
    assert "throughput gate" in flat and "(dflash_min_throughput_ratio)" in flat
    assert f"0.5 x {REFERENCE:.1f} tokens/s of the median of the 1 newest healthy" in flat
    assert "Release v1 is current again and its trainer runs" in flat
    # The wait (5 steps of at least 2 s each) showed progress while it ran: its task naming
    # what it waits on, then progress lines (callback_plugins/dflash.py), no retry lines.
    wait = "Wait for the trainer's health check - 5 training steps of release v2 within 180 s"
    assert wait in flat and "FAILED - RETRYING" not in slow.output, slow.output
    polls = [
        line for line in slow.output.split(wait)[1].split("TASK [")[0].splitlines()
        if line.startswith("[local] still waiting: ")
    ]  # fmt: skip
    assert polls, slow.output

    # Code, env and run.sh of the v1 deployment are back, and its trainer trains.
    assert os.readlink(target_root / "current") == "releases/v1"
    assert (target_root / "run.sh").read_text() == good_run_sh
    trainer = read_json(target_root / "trainer.json")
    assert alive(trainer["pid"])
    manifest = read_json(target_root / "current" / "MANIFEST.json")
    assert wait_for_step(target_root, 1)["code_tree_sha256"] == manifest["tree_sha256"]

    failed, restored = history_of(target_root)[-2:]
    assert (failed["release"], failed["result"], failed["rolled_back_to"]) == (
        "v2", "rolled_back", "v1"
    )  # fmt: skip
    assert failed["tokens_per_s"] <= SLOW_BOUND < 0.5 * REFERENCE
    # The figure the gate judged (the wait for a CPU left out) is the line's too: history
    # shows the one figure of this health check, as it does for a healthy one.
    assert failed["unstarved_tokens_per_s"] >= failed["tokens_per_s"] > 0, failed
    assert "--sleep-per-step 2.0" in failed["run_sh_text"]
    assert "throughput gate" in failed["error"]
    assert (restored["action"], restored["release"], restored["result"]) == (
        "rollback", "v1", "healthy"
    )  # fmt: skip
    assert restored["run_sh_text"] == good_run_sh and restored["run_id"] == trainer["run_id"]
    # keep 1: the rollback target stays, and so does the failed release (for diff.yml).
    assert sorted(p.name for p in (target_root / "releases").iterdir()) == ["v1", "v2"]

    # diff.yml compares against the restored deployment's own figure: set it to the reference
    # for the diff (a measured one is load), then put the measured one back for verify.yml.
    measured = (target_root / "history.jsonl").read_text()
    record_tokens_per_s(target_root, "v1", REFERENCE)
    report = tmp_path / "diff.json"
    diff = playbook("diff.yml", dflash_diff_json=str(report), dflash_diff_from="current",
                    dflash_diff_to="v2")  # fmt: skip
    (target_root / "history.jsonl").write_text(measured)
    assert diff.rc == 0, diff.output
    found = json.loads(report.read_text())["hosts"]["local"]
    assert found["files"]["changed"] == ["dflash/__init__.py"]
    assert "+# v2" in found["files"]["text"]["dflash/__init__.py"]
    changes = {(c["section"], c["name"]): (c["from"], c["to"]) for c in found["changes"]}
    assert changes[("run_sh", "trainer_args.sleep_per_step")] == (IDLE_STEP_S, 2.0)
    assert found["throughput"]["ratio"] < 0.5

    assert playbook("verify.yml").rc == 0, "the rolled-back state must verify clean"


def test_first_release_under_the_floor_fails_and_leaves_no_trainer(deploy, target_root):
    run = deploy("v1", dflash_min_tokens_per_s=1e12)
    assert run.rc != 0
    flat = " ".join(run.output.split())
    assert "under the floor of 1e+12 (dflash_min_tokens_per_s)" in flat
    assert "There is no previous release to go back to; no trainer runs." in flat
    [entry] = history_of(target_root)
    assert (entry["release"], entry["result"]) == ("v1", "failed")
    assert not alive(read_json(target_root / "trainer.json")["pid"])


def test_bad_gate_settings_are_refused_before_anything_changes(deploy, target_root):
    run = deploy("v1", dflash_min_throughput_ratio=1.5)
    assert run.rc != 0
    assert "dflash_min_throughput_ratio=1.5" in run.output
    assert not (target_root / "releases").exists()
