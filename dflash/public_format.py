"""The public DFlash drafter folder, the one serving engines load: `config.json` (a Qwen3
config naming the `DFlashDraftModel` architecture, with `block_size`, `num_target_layers` and
`dflash_config` {target_layer_ids, mask_token_id}) and `model.safetensors` with the drafter's
own weights under the public names. The frozen embedding and lm_head are the target's: the
public drafters leave them out, and so does this folder.

Where the public loaders read each key, and the loader versions this was checked against, is
in the README ("Export"). Our module names are the public ones already (`fc`, `hidden_norm`,
`layers.N.self_attn.q_proj`, ...); `expected_tensors` states them, so a rename in `model.py`
fails an export instead of writing a folder no engine loads.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash.errors import ConfigError
from dflash.model import DrafterConfig
from dflash.target import feature_layer_ids

ARCHITECTURE = "DFlashDraftModel"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PROVENANCE = "dflash_export.json"
CHECKSUMS = "SHA256SUMS"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def expected_tensors(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the public drafter's state dict, by name, with its shape."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    names: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, cfg.num_features * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(cfg.num_layers):
        layer = f"layers.{i}"
        names |= {
            f"{layer}.input_layernorm.weight": (h,),
            f"{layer}.post_attention_layernorm.weight": (h,),
            f"{layer}.self_attn.q_proj.weight": (q, h),
            f"{layer}.self_attn.k_proj.weight": (kv, h),
            f"{layer}.self_attn.v_proj.weight": (kv, h),
            f"{layer}.self_attn.o_proj.weight": (h, q),
            f"{layer}.self_attn.q_norm.weight": (d,),
            f"{layer}.self_attn.k_norm.weight": (d,),
            f"{layer}.mlp.gate_proj.weight": (inter, h),
            f"{layer}.mlp.up_proj.weight": (inter, h),
            f"{layer}.mlp.down_proj.weight": (h, inter),
        }
    return names


def tensor_problems(state: dict[str, Tensor], cfg: DrafterConfig) -> list[str]:
    """Missing, unexpected and misshapen tensors against the public layout; empty when it fits."""
    expected = expected_tensors(cfg)
    problems = [f"missing {name}" for name in sorted(set(expected) - set(state))]
    problems += [f"unexpected {name}" for name in sorted(set(state) - set(expected))]
    problems += [
        f"{name} has shape {tuple(state[name].shape)}, the config gives {shape}"
        for name, shape in expected.items()
        if name in state and tuple(state[name].shape) != shape
    ]
    return problems


def expressible_problems(cfg: DrafterConfig, target_config: Any) -> list[str]:
    """What keeps this drafter, for this target, out of the public format (empty: it fits)."""
    problems = []
    if cfg.hidden_size != target_config.hidden_size:
        problems.append(
            f"the drafter's hidden size {cfg.hidden_size} is not the target's "
            f"{target_config.hidden_size} (the format's fc maps n x the drafter's width)"
        )
    if cfg.vocab_size != target_config.vocab_size:
        problems.append(
            f"the drafter's vocab {cfg.vocab_size} is not the target's {target_config.vocab_size} "
            "(the drafter reads the target's embedding and lm_head)"
        )
    if cfg.num_heads % cfg.num_kv_heads:
        problems.append(
            f"{cfg.num_heads} attention heads are not a multiple of {cfg.num_kv_heads} kv heads"
        )
    if cfg.head_dim % 2:
        problems.append(f"head dim {cfg.head_dim} is odd (RoPE rotates halves)")
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        problems.append(f"mask token id {cfg.mask_token_id} is outside 0..{cfg.vocab_size - 1}")
    if not (math.isfinite(cfg.rope_theta) and cfg.rope_theta > 0):
        problems.append(f"rope theta {cfg.rope_theta} is not a positive number")
    layers = target_config.num_hidden_layers
    if not 1 <= cfg.num_features <= max(1, layers - 2):
        problems.append(
            f"{cfg.num_features} context layers cannot be taken from a target of {layers} layers"
        )
    return problems


def drafter_config_of(saved: dict[str, Any], where: str) -> DrafterConfig:
    """A checkpoint's drafter config; a key the format has no place for is refused by name."""
    known = {f.name for f in fields(DrafterConfig)}
    extra, missing = sorted(set(saved) - known), sorted(known - set(saved))
    if extra or missing:
        raise ConfigError(
            f"{where}: its drafter config cannot be written as a public DFlash config "
            f"(unknown keys {extra or 'none'}, missing {missing or 'none'}); export it with the "
            "release that trained it"
        )
    return DrafterConfig(**saved)


def config_json(cfg: DrafterConfig, target_config: Any, dtype: str) -> dict[str, Any]:
    """config.json of the drafter: the Qwen3 keys of its shape plus the DFlash settings."""
    layers = target_config.num_hidden_layers
    return {
        "architectures": [ARCHITECTURE],
        # As the published drafters: AutoModel finds the class in a dflash.py beside the
        # config (trust_remote_code); that code is not ours to ship.
        "auto_map": {"AutoModel": f"dflash.{ARCHITECTURE}"},
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": cfg.rms_norm_eps,
        # transformers 4.x reads rope_theta / rope_scaling, 5.x and vLLM rope_parameters.
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": target_config.max_position_embeddings,
        "layer_types": ["full_attention"] * cfg.num_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": bool(getattr(target_config, "tie_word_embeddings", False)),
        "bos_token_id": getattr(target_config, "bos_token_id", None),
        "eos_token_id": getattr(target_config, "eos_token_id", None),
        "initializer_range": cfg.init_std,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,  # the name transformers 4.x reads
        "block_size": cfg.block_size,
        "num_target_layers": layers,
        "dflash_config": {
            "target_layer_ids": feature_layer_ids(layers, cfg.num_features),
            "mask_token_id": cfg.mask_token_id,
        },
    }


@dataclass(frozen=True)
class PublicDrafter:
    """A drafter folder read back: our config, fp32 weights, and what it was trained for."""

    cfg: DrafterConfig
    state: dict[str, Tensor]
    target_layer_ids: list[int]
    num_target_layers: int
    provenance: dict[str, Any] | None


def is_drafter_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def _get(config: dict[str, Any], key: str, where: str) -> Any:
    if config.get(key) is None:
        raise ConfigError(f"{where}: config.json has no '{key}'")
    return config[key]


def read_config(config: dict[str, Any], where: str) -> tuple[DrafterConfig, list[int], int]:
    """Our drafter config, the target layer ids and the target's layer count from a public
    config.json; what this trainer's drafter cannot be (another attention, RoPE, activation)
    is refused by name."""
    if ARCHITECTURE not in (config.get("architectures") or []):
        raise ConfigError(
            f"{where}: config.json names {config.get('architectures')}, not {ARCHITECTURE}: "
            "not a DFlash drafter folder"
        )
    problems = []
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config['hidden_act']!r} (only silu)")
    if config.get("attention_bias"):
        problems.append("attention_bias true (no biases here)")
    if any(t != "full_attention" for t in config.get("layer_types") or []):
        problems.append(f"layer_types {config['layer_types']} (only full_attention)")
    rope = config.get("rope_parameters") or {}
    if config.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        problems.append("a scaled RoPE (only the default one)")
    dflash = config.get("dflash_config") or {}
    if dflash.get("mask_token_id") is None:
        problems.append("no dflash_config.mask_token_id")
    if problems:
        raise ConfigError(f"{where}: this trainer's drafter cannot have {'; '.join(problems)}")
    heads = int(_get(config, "num_attention_heads", where))
    hidden = int(_get(config, "hidden_size", where))
    layers = int(_get(config, "num_hidden_layers", where))
    target_layers = int(_get(config, "num_target_layers", where))
    # Without explicit ids the public model spreads one per drafter layer.
    ids = dflash.get("target_layer_ids") or feature_layer_ids(target_layers, layers)
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    cfg = DrafterConfig(
        hidden_size=hidden,
        intermediate_size=int(_get(config, "intermediate_size", where)),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        vocab_size=int(_get(config, "vocab_size", where)),
        num_features=len(ids),
        block_size=int(_get(config, "block_size", where)),
        mask_token_id=int(dflash["mask_token_id"]),
        init_std=float(config.get("initializer_range", 0.02)),
    )
    return cfg, [int(i) for i in ids], target_layers


def read_folder(folder: Path) -> PublicDrafter:
    """A published or exported drafter folder; its weights as fp32 (the trainer's master copy)."""
    from safetensors.torch import load_file

    where = f"drafter folder '{folder}'"
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: config.json cannot be read ({exc})") from exc
    cfg, ids, target_layers = read_config(config, where)
    if not (folder / WEIGHTS).is_file():
        raise ConfigError(f"{where}: no {WEIGHTS} (sharded weights are not read here)")
    state = {name: t.float() for name, t in load_file(folder / WEIGHTS).items()}
    problems = tensor_problems(state, cfg)
    if problems:
        raise ConfigError(f"{where}: {WEIGHTS} does not fit its config: {'; '.join(problems)}")
    provenance = None
    if (folder / PROVENANCE).is_file():
        provenance = json.loads((folder / PROVENANCE).read_text())
    return PublicDrafter(cfg, state, ids, target_layers, provenance)


def target_problems(drafter: PublicDrafter, target_config: Any, target_name: str) -> list[str]:
    """Why this target cannot feed the drafter (its layer count, width, vocab, layer ids)."""
    cfg, layers = drafter.cfg, target_config.num_hidden_layers
    problems = []
    if drafter.num_target_layers != layers:
        problems.append(f"the drafter is for a target of {drafter.num_target_layers} layers")
    if (cfg.hidden_size, cfg.vocab_size) != (target_config.hidden_size, target_config.vocab_size):
        problems.append(
            f"the drafter's hidden/vocab size {cfg.hidden_size}/{cfg.vocab_size} differ from the "
            f"target's {target_config.hidden_size}/{target_config.vocab_size}"
        )
    elif feature_layer_ids(layers, cfg.num_features) != drafter.target_layer_ids:
        problems.append(
            f"target_layer_ids {drafter.target_layer_ids} are not the spread ids "
            f"{feature_layer_ids(layers, cfg.num_features)} this trainer takes"
        )
    return [f"--target-model '{target_name}' ({layers} layers): {p}" for p in problems]
