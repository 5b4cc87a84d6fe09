"""`python -m dflash.train` as the launcher sees it: status.json, SIGTERM, resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

from dflash.codehash import file_hashes, tree_sha256
from dflash.provenance import PACKAGE_DIR

from .conftest import (
    FAST,
    REPO,
    argv,
    cli_env,
    log_losses,
    read_status,
    run_module,
    wait_for_status,
)

MAX_STEPS = 12


def train_args(tmp_path: Path, name: str) -> list[str]:
    files = ["--checkpoint-dir", str(tmp_path / name / "ck")]
    files += ["--status-file", str(tmp_path / name / "status.json"), "--run-id", name]
    every = argv("--checkpoint-every 3 --status-interval 0.2")
    return [*FAST, "--max-steps", str(MAX_STEPS), *every, *files]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One run from step 0 to MAX_STEPS: the reference curve."""
    tmp_path = tmp_path_factory.mktemp("reference")
    result = run_module("dflash.train", *train_args(tmp_path, "ref"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "ref", result.stdout


def test_status_file_fields(uninterrupted):
    folder, stdout = uninterrupted
    status = json.loads((folder / "status.json").read_text())
    fields = "pid run_id state code_tree_sha256 release versions gpus step tokens_per_s loss"
    assert set(status) >= {*argv(fields), "started_at", "updated_at", "checkpoint"}
    assert status["state"] == "stopped" and status["run_id"] == "ref"
    assert isinstance(status["pid"], int)
    assert status["step"] == MAX_STEPS
    assert status["tokens_per_s"] > 0 and status["loss"] > 0
    assert status["code_tree_sha256"] == tree_sha256(file_hashes(PACKAGE_DIR))
    assert status["release"] == "unreleased"  # no MANIFEST.json beside the checkout's package
    assert status["versions"]["torch"] == torch.__version__
    assert set(status["versions"]) == {"python", "torch", "triton", "cuda"}
    assert status["gpus"] == {"target": [], "drafter": []}
    started = datetime.fromisoformat(status["started_at"])
    assert started.utcoffset().total_seconds() == 0
    assert started <= datetime.fromisoformat(status["updated_at"])
    assert status["checkpoint"]["step"] == MAX_STEPS
    assert Path(status["checkpoint"]["path"]).is_file()
    # The log opens with the header block, then one line per step.
    head = "\n".join(stdout.splitlines()[:9])
    needles = ["run_id: ref", "release: unreleased", "code_tree_sha256: ", "torch "]
    for needle in [*needles, "gpus: target cpu drafter cpu"]:
        assert needle in head
    assert sorted(log_losses(stdout)) == list(range(1, MAX_STEPS + 1))
    assert "tokens/s" in stdout and "lr " in stdout


@pytest.mark.slow
def test_the_first_steps_are_written_at_once_not_at_the_next_heartbeat(tmp_path):
    """A deploy's health check waits on the first steps: each is in status.json as it ends,
    with no heartbeat (600 s apart here) needed to write it."""
    status_path = tmp_path / "status.json"
    files = ["--checkpoint-dir", str(tmp_path / "ck"), "--status-file", str(status_path)]
    slow = argv("--max-steps 30 --sleep-per-step 0.3 --status-interval 600 --run-id eager")
    command = [sys.executable, "-m", "dflash.train", *FAST, *slow, *files]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    process = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), **pipes)
    try:
        # Step 1 comes with the change to `running`; steps 2-29 only if each step is written
        # (8 s in which a loaded machine's test process gets to look).
        seen = wait_for_status(status_path, lambda s: s["state"] == "running" and s["step"] >= 2)
        log, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, log
    assert 2 <= seen["step"] < 30, seen


def test_sigterm_checkpoints_and_a_restart_continues_the_same_curve(tmp_path, uninterrupted):
    reference, reference_log = uninterrupted
    folder = tmp_path / "run"
    status_path = folder / "status.json"
    args = train_args(tmp_path, "run")
    # A slow step gives the test time to signal mid-run; sleeping does not change the maths.
    command = [sys.executable, "-m", "dflash.train", *args, "--sleep-per-step", "1.0"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    process = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), **pipes)
    try:
        running = wait_for_status(status_path, lambda s: s["state"] == "running" and s["step"] >= 4)
        assert running["pid"] == process.pid
        beat = running["updated_at"]
        wait_for_status(status_path, lambda s: s["updated_at"] != beat)  # the heartbeat goes on
        process.send_signal(signal.SIGTERM)
        first_log, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, first_log
    stopped = read_status(status_path)
    assert stopped["state"] == "stopped"
    stop_step = stopped["step"]
    assert 4 <= stop_step < MAX_STEPS, first_log
    assert stopped["checkpoint"]["step"] == stop_step
    assert f"stopped at step {stop_step}: SIGTERM received" in first_log

    # A newer but truncated checkpoint (a crash mid-write without the rename) is skipped.
    good = Path(stopped["checkpoint"]["path"])
    truncated = good.with_name("step-00099999.pt")
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])

    result = run_module("dflash.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"warning: skipping checkpoint {truncated}" in result.stdout
    assert f"resumed from {good} at step {stop_step}" in result.stdout
    assert read_status(status_path)["resumed_from_step"] == stop_step

    # The two halves make the reference curve, step for step.
    losses = {**log_losses(first_log), **log_losses(result.stdout)}
    assert losses == log_losses(reference_log)
    assert min(log_losses(result.stdout)) == stop_step + 1

    # Same weights and optimizer state at the end: the resume lost and repeated nothing.
    mine = torch.load(folder / "ck" / f"step-{MAX_STEPS:08d}.pt", weights_only=True)
    theirs = torch.load(reference / "ck" / f"step-{MAX_STEPS:08d}.pt", weights_only=True)
    for key, tensor in theirs["drafter"].items():
        assert torch.equal(mine["drafter"][key], tensor), key
    for index, state in theirs["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(mine["optimizer"]["state"][index][key], value), (index, key)
    assert mine["data"] == theirs["data"] and mine["tokens"] == theirs["tokens"]


def test_eval_cli_reports_tau(tmp_path, uninterrupted):
    folder, _ = uninterrupted
    out = tmp_path / "tau.json"
    args = ["--checkpoint-dir", str(folder / "ck"), "--out", str(out)]
    result = run_module(
        "dflash.eval", *args, *argv("--num-samples 2 --max-new-tokens 8"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["step"] == MAX_STEPS and report["samples"] == 2
    assert 1.0 <= report["tau"] <= report["block_size"]


def test_module_entry_points_show_help():
    for module in ("dflash.train", "dflash.warmup", "dflash.eval"):
        result = run_module(module, "--help", cwd=REPO)
        assert result.returncode == 0 and "usage: python -m " + module in result.stdout


def test_a_store_run_reports_its_data_and_resumes_its_order_on_the_same_data_only(tmp_path):
    """status.json and the checkpoint name the data; a restart on the same store resumes the
    order, on a store prepared again from other records starts a new one and says so."""
    from dflash.data.prepare import prepare
    from dflash.data.records import Settings

    def records(seed: int, ids: int = 120) -> str:
        rows = [{"input_ids": [(seed + i * 7 + k) % ids for k in range(12)], "loss_mask":
                 [0] * 4 + [1] * 8} for i in range(40)]  # fmt: skip
        return "".join(json.dumps(row) + "\n" for row in rows)

    (tmp_path / "a.jsonl").write_text(records(1))
    store = tmp_path / "store"
    first = prepare([tmp_path / "a.jsonl"], store, Settings(64, 128, None), say=lambda _: None)
    args = [*FAST, "--data", str(store), "--checkpoint-dir", str(tmp_path / "ck"),
            "--status-file", str(tmp_path / "status.json"), "--checkpoint-every", "2"]  # fmt: skip
    result = run_module("dflash.train", *args, "--max-steps", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"sha256 {first['content_sha256'][:12]}" in result.stdout
    assert "warning: data" not in result.stdout  # ids 0-119 only: no mask id among them
    status = read_status(tmp_path / "status.json")
    assert status["data"]["kind"] == "store" and status["data"]["path"] == str(store)
    assert status["data"]["content_sha256"] == first["content_sha256"]
    assert status["data"]["samples"] == 40 and status["data"]["sources"][0]["name"] == "a.jsonl"
    saved = torch.load(tmp_path / "ck" / "step-00000002.pt", weights_only=True)
    assert saved["training_data"]["content_sha256"] == first["content_sha256"]
    assert saved["data"]["data_sha256"] == first["content_sha256"]

    result = run_module("dflash.train", *args, "--max-steps", "4", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert read_status(tmp_path / "status.json")["data_order"] == "resumed"
    assert "new data order" not in result.stdout

    (tmp_path / "b.jsonl").write_text(records(2, ids=128))  # 127, the tiny target's mask, too
    second = prepare([tmp_path / "b.jsonl"], store, Settings(64, 128, None), force=True,
                     say=lambda _: None)  # fmt: skip
    result = run_module("dflash.train", *args, "--max-steps", "6", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    before, now = first["content_sha256"][:12], second["content_sha256"][:12]
    assert "warning: data: token id 127 is the target's mask id" in result.stdout
    note = (
        f"new data order: the data differ from the checkpoint's (sha256 {before} -> {now}); "
        "the weights are resumed, the order starts at epoch 0"
    )
    assert f"warning: {note}" in result.stdout
    assert "resumed from" in result.stdout
    status = read_status(tmp_path / "status.json")
    assert status["data_order"] == note and status["data"]["content_sha256"] == second[
        "content_sha256"]  # fmt: skip
