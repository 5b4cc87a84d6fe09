"""What the step's flags (config.StepConfig) resolve to: token budget, rows, gamma, drafter."""

from __future__ import annotations

from typing import Any

import torch

from dflash.config import StepConfig
from dflash.errors import ConfigError
from dflash.flags import CPU_TOKEN_BUDGET, DEFAULT_GAMMA
from dflash.model import Drafter, DrafterConfig


def token_budget(config: StepConfig, on_gpu: bool) -> int:
    return config.token_budget or (config.max_seq_len if on_gpu else CPU_TOKEN_BUDGET)


def fixed_rows(config: StepConfig, on_gpu: bool) -> int:
    """Rows per step when shapes are static (GPU, --compile-drafter): budget // max length."""
    rows = token_budget(config, on_gpu) // config.max_seq_len
    if rows < 1:
        raise ConfigError(
            f"--token-budget {token_budget(config, on_gpu)}: with static shapes (a GPU or "
            f"--compile-drafter) every row is padded to --max-seq-len {config.max_seq_len}; "
            "give a budget of at least that"
        )
    return rows


def gamma(config: StepConfig) -> float:
    if config.gamma is not None:
        return config.gamma
    if config.block_size not in DEFAULT_GAMMA:
        known = ", ".join(str(b) for b in DEFAULT_GAMMA)
        raise ConfigError(
            f"--block-size {config.block_size}: no default gamma for this size (known: {known}); "
            "pass --gamma"
        )
    return DEFAULT_GAMMA[config.block_size]


def drafter_config(config: StepConfig, target_config: Any, mask_token_id: int) -> DrafterConfig:
    try:
        return DrafterConfig.from_target(
            target_config,
            config.drafter_layers,
            config.num_target_layers,
            config.block_size,
            mask_token_id,
        )
    except ValueError as exc:
        raise ConfigError(f"--target-model '{config.target_model}': {exc}") from exc


# Which flag sets each drafter setting; the rest follows the target (--target-model).
SETTING_FLAGS = {
    "num_layers": "--drafter-layers",
    "num_features": "--num-target-layers",
    "block_size": "--block-size",
    "mask_token_id": "--mask-token-id",
}


def drafter_differences(there: DrafterConfig, now: DrafterConfig) -> list[str]:
    """How a saved drafter differs from the one the flags build, with the flag that matches it
    (the weights' init scale does not count: the weights are replaced)."""
    theirs, ours = there.as_dict(), now.as_dict()
    out = []
    for key in ours:
        if key != "init_std" and theirs[key] != ours[key]:
            fix = f"{SETTING_FLAGS[key]} {theirs[key]}" if key in SETTING_FLAGS else "the target's"
            out.append(f"{key} {theirs[key]!r} there, {ours[key]!r} now ({fix})")
    return out


def build_drafter(
    cfg: DrafterConfig,
    embed_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
    device: torch.device,
    seed: int,
) -> Drafter:
    """fp32 trainable weights (the master copy), made on the device; frozen target weights are
    shared when the target lives on the same device (colocated), else copied there."""
    torch.manual_seed(seed)
    with torch.device(device):
        return Drafter(cfg, embed_weight.to(device), lm_head_weight.to(device))
