"""verify.yml's `gpu` finding on a real GPU: the real trainer deployed to the local target on
one GPU, then a second process allocates memory on that GPU; verify names it with its pid and
memory, and not the trainer; once it exits the GPU is clean again.

Runs on a machine with an NVIDIA GPU, standalone (no test bed, no CPU wheelhouse):

    DFLASH_GPU_VARS=gpu-vars.yml .venv/bin/pytest tests/integration/test_local_verify_gpu.py

where gpu-vars.yml holds the deploy's variables for that machine: a `dflash_env_lock` whose env runs
the trainer on CUDA (its wheelhouse or index there), optionally `dflash_trainer_args`. The job
runs colocated on GPU `DFLASH_GPU_INDEX` (default 0)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import run_playbook

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not shutil.which("nvidia-smi"), reason="needs an NVIDIA GPU (nvidia-smi)"),
    pytest.mark.skipif(
        not os.environ.get("DFLASH_GPU_VARS"),
        reason="needs DFLASH_GPU_VARS: a file of deploy variables with a CUDA dflash_env_lock "
        "(see this module's docstring)",
    ),
]
GPU = int(os.environ.get("DFLASH_GPU_INDEX", "0"))
# A small drafter step (tests/trainer/test_gpu.py's shape): the check is about who holds the GPU.
ARGS = {"target_model": "tiny", "gen_samples": 64, "drafter_layers": 2, "max_seq_len": 64,
        "token_budget": 256, "num_anchors": 32}  # fmt: skip
HOLD_MIB = 2048
HOLDER = f"""
import time, torch
block = torch.empty({HOLD_MIB} << 20, dtype=torch.uint8, device="cuda:{GPU}")
print("holding", flush=True)
time.sleep(600)
"""


def gpu_findings(run) -> list[dict]:
    return [f for f in run.report["hosts"]["local"]["findings"] if f["kind"] == "gpu"]


def test_a_second_process_on_the_jobs_gpu_is_named_with_its_pid_and_memory(tmp_path: Path):
    given = yaml.safe_load(Path(os.environ["DFLASH_GPU_VARS"]).read_text())
    root, report = tmp_path / "target" / "dflash", tmp_path / "reports" / "verify.json"
    root.parent.mkdir(parents=True)
    variables = {
        "dflash_trainer_args": ARGS,
        **given,
        "dflash_root": str(root),
        "dflash_verify_json": str(report),
        "dflash_target_gpus": [GPU],
        "dflash_drafter_gpus": [GPU],
        "dflash_colocated": True,
        "dflash_health_timeout": 900,
        "dflash_min_throughput_ratio": 0,
        "dflash_verify_min_throughput_ratio": 0,  # this test is about who holds the GPU
        "dflash_verify_max_cpu_wait": 1,
    }

    def verify():
        run = run_playbook("verify.yml", variables)
        run.report = json.loads(report.read_text())
        return run

    deployed = run_playbook("deploy.yml", variables, timeout=1800)
    holder = None
    try:
        assert deployed.rc == 0, deployed.output
        clean = verify()
        assert clean.rc == 0 and gpu_findings(clean) == [], clean.output
        assert clean.report["hosts"]["local"]["checks"]["gpu"].startswith(f"checked GPUs {GPU}")

        lock_id = json.loads((root / "history.jsonl").read_text().splitlines()[-1])["lock_id"]
        env_python = root / "envs" / lock_id / "bin" / "python"  # the CUDA torch of the lock
        holder = subprocess.Popen([str(env_python), "-c", HOLDER], stdout=subprocess.PIPE,
                                  text=True)  # fmt: skip
        assert holder.stdout.readline().strip() == "holding"
        held = verify()
        assert held.rc != 0
        [item] = gpu_findings(held)
        trainer = json.loads((root / "trainer.json").read_text())["pid"]
        if held.report["hosts"]["local"]["gpu"]["pids"] == "here":
            # The driver names processes by the pids seen here: the holder, not the trainer.
            assert (item["pid"], item["gpu"]) == (holder.pid, GPU), item
            if item["used_mib"] is None:  # some drivers list a process without its memory
                assert "memory not reported" in item["found"]
            else:
                assert item["used_mib"] >= HOLD_MIB and f"{item['used_mib']} MiB" in item["found"]
        else:
            # A container whose driver gives the node's pids: both holders are listed.
            assert item["gpu"] == GPU and len(item["pids"]) == 2, item
        assert item.get("pid") != trainer
        print("\n".join(line for line in held.output.splitlines() if "gpu" in line.lower()))

        holder.kill()
        holder.wait()
        gone = verify()
        assert gone.rc == 0 and gpu_findings(gone) == [], gone.output
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        run_playbook("playbooks/stop.yml", variables)
