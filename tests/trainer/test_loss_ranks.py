"""The loss is global over drafter ranks: two ranks with very unequal supervised tokens give
the loss and gradients of one rank trained on both batches (the union): to 1e-6 on the CPU
(gloo, --cpu-ranks); on two GPUs (NCCL, bf16 autocast) far closer than per-rank normalising."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash.config import TrainConfig
from dflash.flags import train_parser
from dflash.options import build_drafter, drafter_config, gamma
from dflash.pipeline import FeatureBatch
from dflash.step import DrafterStep
from dflash.target import load_target

from .conftest import REPO, argv, cli_env

SEQ = 64
# All SEQ anchors are sampled: every valid anchor is used, so the blocks do not depend on the
# random draw, and one rank on the union sees exactly the blocks the two ranks saw.
FLAGS = argv(
    f"--target-model tiny --drafter-layers 2 --max-seq-len {SEQ} --token-budget {SEQ} "
    f"--num-anchors {SEQ} --grad-clip 1e9 --dist-timeout 60 --target-gpus 0,1 --drafter-gpus 0,1"
)
ON = {
    "cpu": pytest.param(["--cpu-ranks"], id="gloo"),
    "cuda": pytest.param(
        [],
        id="nccl",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
        ],
    ),
}


def write_data(path: Path) -> list[int]:
    """Two samples of one row each (one batch per drafter rank): 56 and 6 supervised tokens."""
    ids = torch.randint(0, 120, (2, SEQ), generator=torch.Generator().manual_seed(3)).tolist()
    masks = [[int(i >= 8) for i in range(SEQ)], [int(40 <= i < 46) for i in range(SEQ)]]
    lines = [json.dumps({"input_ids": i, "loss_mask": m}) for i, m in zip(ids, masks, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return [sum(m) for m in masks]


def one_rank(
    config: TrainConfig, batches: list[dict], per_rank: bool
) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and gradients of one process on the union of the batches (per_rank: the mean
    over batches of each one's own normalised loss, what DDP gave before the global loss)."""
    device = torch.device("cpu" if config.cpu_ranks else "cuda:0")
    target = load_target(config.target_model, device, config.num_target_layers, None)
    cfg = drafter_config(config, target.config, target.mask_token_id)
    drafter = build_drafter(cfg, target.embed_weight(), target.lm_head_weight(), target.device, 0)
    step = DrafterStep(drafter, gamma(config), config.num_anchors, compile=False, static=True)

    def feature_batch(parts: list[dict]) -> FeatureBatch:
        ids = torch.cat([p["input_ids"] for p in parts]).to(device)
        # Row by row, as each rank ran its target: no batch-size dependent rounding.
        features = torch.cat([target.forward(p["input_ids"].to(device))[0] for p in parts])
        mask = torch.cat([p["loss_mask"] for p in parts]).to(device)
        return FeatureBatch(ids, mask, features, int(ids.numel()))

    generator = torch.Generator().manual_seed(0)
    groups = [[b] for b in batches] if per_rank else [batches]
    losses = [step.loss(feature_batch(group), generator) / len(groups) for group in groups]
    total = torch.stack(losses).sum()
    total.backward()
    return total.item(), {n: p.grad.cpu() for n, p in drafter.named_parameters()}


def largest_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in b)


@pytest.mark.parametrize("layout", ON.values())
def test_two_drafter_ranks_with_unequal_tokens_train_like_one_rank_on_both(tmp_path, layout):
    supervised = write_data(tmp_path / "data.jsonl")
    flags = [*FLAGS, *layout, "--data", str(tmp_path / "data.jsonl")]
    out = tmp_path / "probe.pt"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    probe = [*launcher, "--nproc-per-node", "2", str(REPO / "tests/trainer/rank_probe.py")]
    result = subprocess.run(
        [*probe, str(out), *flags, "--checkpoint-dir", str(tmp_path / "ck")],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    probe_out = torch.load(out, weights_only=True)
    batches = probe_out["batches"]
    # Each rank had one of the two samples: deliberately unequal supervised tokens.
    assert sorted(int(b["loss_mask"].sum()) for b in batches) == sorted(supervised) == [6, 56]

    config = TrainConfig.from_args(train_parser().parse_args(flags))
    loss, grads = one_rank(config, batches, per_rank=False)
    _, per_rank = one_rank(config, batches, per_rank=True)
    assert probe_out["grads"].keys() == grads.keys()
    gap = largest_gap(per_rank, grads)
    assert gap > 1e-3, gap  # the test can tell: normalising per rank gives other gradients
    if config.cpu_ranks:
        # The loss the log reports (mean of the ranks' values) is the global one.
        assert math.isclose(probe_out["loss"], loss, rel_tol=1e-6), (probe_out["loss"], loss)
        for name, grad in grads.items():
            got = probe_out["grads"][name]
            torch.testing.assert_close(got, grad, atol=1e-6, rtol=1e-6, msg=name)
    else:  # bf16 autocast: the same objective, to rounding far below the per-rank gap
        assert math.isclose(probe_out["loss"], loss, rel_tol=1e-3), (probe_out["loss"], loss)
        assert largest_gap(probe_out["grads"], grads) * 10 < gap
