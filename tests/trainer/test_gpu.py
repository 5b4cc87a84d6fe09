"""GPU checks: flex_attention agrees with the CPU path; a GPU run trains, warms up, evaluates;
split and colocated runs over two GPUs (NCCL) train the same drafter."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dflash.mask import blockwise_dense_mask, flex_block_mask
from dflash.model import Drafter, DrafterConfig
from dflash.objective import block_inputs

from .conftest import argv, cli_env, log_losses, run_module

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SHAPE = argv("--drafter-layers 2 --max-seq-len 64 --token-budget 256 --num-anchors 32")
GPU_RUN = [*argv("--target-model tiny --gen-samples 64 --log-every 1"), *SHAPE]
SMALL_GPU_RUN = [*argv("--target-gpus 0 --drafter-gpus 0"), *GPU_RUN]


def random_drafter(device: torch.device) -> Drafter:
    cfg = DrafterConfig(
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        vocab_size=300,
        num_features=3,
        block_size=16,
        mask_token_id=299,
        init_std=0.02,
    )
    g = torch.Generator(device=device).manual_seed(0)
    embed = torch.randn(300, 128, generator=g, device=device)
    torch.manual_seed(0)
    with torch.device(device):
        return Drafter(cfg, embed, embed)


def test_flex_attention_matches_the_sdpa_path():
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda:0")
    drafter = random_drafter(device)
    rows, ctx_len, n = 2, 200, 12  # neither length is a multiple of flex's 128-wide tiles
    g = torch.Generator(device=device).manual_seed(1)
    features = torch.randn(rows, ctx_len, 3 * 128, generator=g, device=device)
    ids = torch.randint(0, 299, (rows, ctx_len), generator=g, device=device)
    starts = torch.randint(0, ctx_len - 1, (rows, n), generator=g, device=device)
    anchors = torch.sort(starts).values
    kept = torch.rand(rows, n, generator=g, device=device) < 0.8
    block_ids, positions = block_inputs(ids, anchors, 16, 299)

    keep = kept.repeat_interleave(16, dim=1)
    # A random projection of the kept outputs: a well-conditioned loss (a sum of squares after
    # the final RMSNorm is nearly constant, so its gradient would be rounding noise).
    projection = torch.randn(int(keep.sum()), 128, generator=g, device=device)
    outputs, grads = [], []
    for mask in (
        flex_block_mask(anchors, kept, ctx_len, 16),
        blockwise_dense_mask(anchors, kept, ctx_len, 16),
    ):
        drafter.zero_grad()
        hidden = drafter(features, block_ids, positions, mask)
        (hidden[keep] * projection).sum().backward()
        outputs.append(hidden[keep].detach())
        grads.append(drafter.fc.weight.grad.clone())
    flex, sdpa = outputs
    assert ((flex - sdpa).norm() / sdpa.norm()).item() < 1e-5
    assert ((grads[0] - grads[1]).norm() / grads[1].norm()).item() < 1e-4


def test_a_training_step_on_the_gpu_then_eval(tmp_path):
    status_path = tmp_path / "status.json"
    files = ["--checkpoint-dir", str(tmp_path / "ck"), "--status-file", str(status_path)]
    result = run_module(
        "dflash.train", *SMALL_GPU_RUN, "--max-steps", "3", *files, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    status = json.loads(status_path.read_text())
    assert status["state"] == "stopped" and status["step"] == 3
    assert status["gpus"] == {"target": [0], "drafter": [0]}
    assert status["versions"]["cuda"] and status["loss"] > 0
    assert "gpus: target 0 drafter 0" in result.stdout

    out = tmp_path / "tau.json"
    args = ["--checkpoint-dir", str(tmp_path / "ck"), "--out", str(out)]
    args += argv("--gpu 0 --num-samples 2 --max-new-tokens 8")
    evaluated = run_module("dflash.eval", *args, cwd=tmp_path, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert 1.0 <= json.loads(out.read_text())["tau"] <= 16


@pytest.mark.slow
def test_warmup_then_a_compiled_run(tmp_path):
    env = {**cli_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    warmed = run_module(
        "dflash.warmup",
        "--drafter-gpus",
        "0",
        "--compile-drafter",
        "--compile-target",
        *SHAPE,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert warmed.returncode == 0, warmed.stderr
    line = json.loads(warmed.stdout.splitlines()[-1])
    assert line["device"] == "cuda:0" and line["warm_step_s"] < line["first_step_s"]
    assert line["target"]["ok"], line
    assert os.listdir(tmp_path / "inductor")

    files = ["--checkpoint-dir", str(tmp_path / "ck"), "--status-file", str(tmp_path / "s")]
    result = run_module(
        "dflash.train",
        *SMALL_GPU_RUN,
        "--compile-drafter",
        "--compile-target",
        "--max-steps",
        "3",
        *files,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The warmup compiled every graph training runs, the target's layer included.
    cache = json.loads((tmp_path / "s").read_text())["compile_cache"]
    assert cache["hits"] > 0 and cache["misses"] == 0, cache


def torchrun_gpus(tmp_path, name: str, target: str, drafter: str, *extra: str):
    """torchrun with one process per distinct GPU, as run.sh starts it."""
    nproc = len(set(target.split(",")) | set(drafter.split(",")))
    files = ["--checkpoint-dir", str(tmp_path / name), "--status-file", str(tmp_path / name / "s")]
    return run_module(
        "torch.distributed.run",
        *argv(f"--standalone --nproc-per-node {nproc} -m dflash.train"),
        *argv(f"--target-gpus {target} --drafter-gpus {drafter}"),
        *GPU_RUN,
        *extra,
        *files,
        cwd=tmp_path,
        timeout=600,
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_split_over_two_gpus_trains_like_colocated(tmp_path):
    steps = ["--max-steps", "6"]
    split = torchrun_gpus(tmp_path, "split", "0", "1", *steps)
    assert split.returncode == 0, split.stdout + split.stderr
    colocated = torchrun_gpus(tmp_path, "one", "0", "0", *steps)
    assert colocated.returncode == 0, colocated.stdout + colocated.stderr
    mine, theirs = log_losses(split.stdout), log_losses(colocated.stdout)
    assert sorted(mine) == list(range(1, 7))
    assert mine == pytest.approx(theirs, rel=1e-3, abs=1e-3)
    status = json.loads((tmp_path / "split" / "s").read_text())
    assert status["state"] == "stopped" and status["gpus"] == {"target": [0], "drafter": [1]}
    assert all(status["stages"][k] is not None for k in ("target_forward", "transfer"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_colocated_on_two_gpus_is_data_parallel(tmp_path):
    result = torchrun_gpus(tmp_path, "dp", "0,1", "0,1", "--max-steps", "3", "--compile-drafter")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 drafter rank(s)" in result.stdout
    assert json.loads((tmp_path / "dp" / "s").read_text())["step"] == 3


def test_the_fused_chunk_loss_matches_the_fp32_reference():
    """The compiled per-chunk softmax of the lm_head loss (dflash.objective) against the same
    code uncompiled in fp32 on the CPU, from the same bf16 logits: the loss within 1e-5, the
    gradient within its bf16 rounding (2e-2 relative L2); a chunk of other rows (the last
    one) too."""
    from dflash.objective import chunk_loss_and_grad, compiled_chunk_loss_and_grad

    g = torch.Generator().manual_seed(0)
    for rows in (256, 100):
        logits = (torch.randn(rows, 8192, generator=g) * 4).to(torch.bfloat16)
        labels = torch.randint(0, 8192, (rows,), generator=g)
        scale = torch.rand(rows, generator=g)
        ref_loss, ref_grad = chunk_loss_and_grad(logits.float(), labels, scale, True)
        loss, grad = compiled_chunk_loss_and_grad()(
            logits.cuda(), labels.cuda(), scale.cuda(), True
        )
        assert grad.dtype == torch.bfloat16
        assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
        error = torch.linalg.vector_norm(grad.float().cpu() - ref_grad)
        assert error <= 2e-2 * torch.linalg.vector_norm(ref_grad), (rows, error)
