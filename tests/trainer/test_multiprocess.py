"""`torchrun ... -m dflash.train` on the CPU: the GPU layouts as gloo processes (--cpu-ranks).

Split and colocated ranks train the same drafter from the same seed and data (the features
travel, the maths does not change); SIGTERM stops every rank after the same step with a
checkpoint, and a resumed split run continues the curve; a rank that fails fails the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import argv, cli_env, log_losses, read_status, wait_for_status

SHAPE = argv(
    "--target-model tiny --drafter-layers 2 --gen-samples 64 --log-every 1 --max-seq-len 64 "
    "--token-budget 256 --num-anchors 16 --cpu-ranks --dist-timeout 60"
)

# Not in `make test-quick`: torchrun process groups on the CPU.
pytestmark = pytest.mark.slow
SPLIT = argv("--target-gpus 0 --drafter-gpus 1")
COLOCATED = argv("--target-gpus 0 --drafter-gpus 0")
STEPS = 8


def files(tmp_path: Path, name: str) -> list[str]:
    folder = tmp_path / name
    return ["--checkpoint-dir", str(folder / "ck"), "--status-file", str(folder / "status.json")]


def torchrun(nproc: int, *args: str) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, "--nproc-per-node", str(nproc), "-m", "dflash.train", *args]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )


def start(command: list[str], cwd: Path) -> subprocess.Popen[str]:
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    return subprocess.Popen(command, cwd=cwd, env=cli_env(), **pipes)


def finish(process: subprocess.Popen[str], timeout: float = 600) -> str:
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        process.kill()
    return out


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def final_weights(tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    path = tmp_path / name / "ck" / f"step-{STEPS:08d}.pt"
    return torch.load(path, weights_only=True)["drafter"]


def assert_same_drafter(tmp_path: Path, a: str, b: str) -> None:
    mine, theirs = final_weights(tmp_path, a), final_weights(tmp_path, b)
    assert mine.keys() == theirs.keys()
    for key, tensor in theirs.items():
        torch.testing.assert_close(mine[key], tensor, msg=key)


def test_split_stops_on_sigterm_and_resumes_on_the_colocated_curve(tmp_path):
    steps = ["--max-steps", str(STEPS)]
    reference = start(
        [sys.executable, "-m", "dflash.train", *SHAPE, *COLOCATED, *steps, *files(tmp_path, "c")],
        tmp_path,
    )
    status_path = tmp_path / "s" / "status.json"
    slow = [*SHAPE, *SPLIT, *steps, *files(tmp_path, "s"), "--sleep-per-step", "1.0"]
    split = start(torchrun(2, *slow), tmp_path)
    try:
        wait_for_status(status_path, lambda s: s["state"] == "running" and s["step"] >= 2)
        workers = children(split.pid)
        assert len(workers) == 2
        for pid in workers:  # what torchrun does with a SIGTERM of its own
            os.kill(pid, signal.SIGTERM)
        first_log = finish(split)
    finally:
        split.kill()
    assert split.returncode == 0, first_log  # every rank exited 0
    stopped = read_status(status_path)
    assert stopped["state"] == "stopped" and stopped["gpus"] == {"target": [0], "drafter": [1]}
    stop_step = stopped["step"]
    assert 2 <= stop_step < STEPS and stopped["checkpoint"]["step"] == stop_step
    assert f"stopped at step {stop_step}: SIGTERM received" in first_log
    stages = stopped["stages"]
    for name in ("target_forward", "transfer", "target_idle", "drafter_idle", "optimizer"):
        assert stages[name] >= 0, name
    assert "transfer" in first_log and "drafter_idle" in first_log

    resumed = run(torchrun(2, *SHAPE, *SPLIT, *steps, *files(tmp_path, "s")), tmp_path)
    assert resumed.returncode == 0, resumed.stdout
    assert f"resumed from {stopped['checkpoint']['path']} at step {stop_step}" in resumed.stdout

    reference_log = finish(reference)
    assert reference.returncode == 0, reference_log
    losses = {**log_losses(first_log), **log_losses(resumed.stdout)}
    assert losses == log_losses(reference_log)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert_same_drafter(tmp_path, "s", "c")


def test_two_drafter_ranks_train_alike_split_or_colocated(tmp_path):
    steps = ["--max-steps", str(STEPS)]
    split = start(torchrun(3, *SHAPE, *argv("--target-gpus 0 --drafter-gpus 1,2"), *steps,
                           *files(tmp_path, "s")), tmp_path)  # fmt: skip
    colocated = start(torchrun(2, *SHAPE, *argv("--target-gpus 0,1 --drafter-gpus 0,1"),
                               *steps, *files(tmp_path, "c")), tmp_path)  # fmt: skip
    split_log, colocated_log = finish(split), finish(colocated)
    assert split.returncode == 0, split_log
    assert colocated.returncode == 0, colocated_log
    assert "ranks: 3 (0: target cpu, 1: drafter cpu, 2: drafter cpu)" in split_log
    assert "[rank 0] served 10 steps to drafter ranks [1, 2]" in split_log  # 8 + prefetch 2
    losses = log_losses(split_log)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses == log_losses(colocated_log)
    assert_same_drafter(tmp_path, "s", "c")
    status = json.loads((tmp_path / "s" / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] == STEPS


def test_a_failing_rank_fails_the_job(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, 3]}\nnot json\n')  # only target ranks read the data
    result = run(torchrun(2, *SHAPE, *SPLIT, "--data", str(bad), *files(tmp_path, "f")), tmp_path)
    assert result.returncode != 0
    assert f"[rank 0] error: --data '{bad}' line 2: not JSON" in result.stdout
    status = json.loads((tmp_path / "f" / "status.json").read_text())
    assert status["state"] == "failed" and status["error"]  # the drafter saw its peer go
