"""The DFlash drafter: a few Qwen3-style decoder layers of the target's width.

Each layer's queries come from the block slots; its keys and values come from the fused target
context followed by the block slots, through the same k/v projections (non-causal, masked by
`dflash.mask`). The token embedding and lm_head are the target's, frozen: they are buffers, so
they are neither trained nor saved in checkpoints.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention


@functools.cache
def compiled_flex_attention() -> Any:
    """flex_attention is only fast when compiled; built on first use (CPU runs never pay)."""
    return torch.compile(flex_attention, dynamic=False)


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_features: int  # target layers fused into the context
    block_size: int
    mask_token_id: int
    init_std: float

    @classmethod
    def from_target(
        cls, config: Any, num_layers: int, num_features: int, block_size: int, mask_token_id: int
    ) -> DrafterConfig:
        """Take the target's width, heads and RoPE from a Hugging Face config."""
        # transformers 5 says it in `rope_parameters`; 4.x in `rope_scaling` (`type` before
        # 4.45, `rope_type` after), with `rope_theta` beside it: a scaling missed here would
        # train the drafter with plain RoPE under a YaRN target.
        rope = getattr(config, "rope_parameters", None) or {}
        scaling = getattr(config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
        if (rope_type or "default") != "default":
            raise ValueError(f"target RoPE type {rope_type!r} is not supported (only 'default')")
        heads = config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            vocab_size=config.vocab_size,
            num_features=num_features,
            block_size=block_size,
            mask_token_id=mask_token_id,
            init_std=getattr(config, "initializer_range", 0.02),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rope_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of shape [batch, 1, T, head_dim] for integer positions [batch, T]."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = theta ** (-exponent / head_dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | BlockMask) -> Tensor:
    """flex_attention with a block mask on the GPU, block-wise SDPA with a dense mask elsewhere."""
    if isinstance(mask, BlockMask):
        # Inside a compiled layer Dynamo compiles flex_attention with the layer; the cached
        # compiled function is for eager callers (Dynamo does not trace a functools.cache).
        flex = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
        return flex(q, k, v, block_mask=mask, enable_gqa=True)
    return blockwise_sdpa(q, k, v, mask)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm whose fp32 master weight meets a bf16 input (autocast) in the input's dtype,
    so the fused kernel runs (it refuses mixed dtypes); the gradient still reaches the fp32
    weight through the cast."""

    def forward(self, x: Tensor) -> Tensor:
        weight = None if self.weight is None else self.weight.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)


def blockwise_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Attention of each block over [context | its own block] only, with a dense mask from
    `dflash.mask.blockwise_dense_mask`: the same result as the full layout, without the
    (N*B)^2 keys a block can never see."""
    batch, heads, q_len, dim = q.shape
    block_size = mask.shape[2]
    ctx_len = k.shape[2] - q_len
    n = q_len // block_size

    def per_block(x: Tensor) -> Tensor:  # [b, h, N*B, d] -> [b*N, h, B, d]
        x = x.view(batch, x.shape[1], n, block_size, dim).transpose(1, 2)
        return x.reshape(batch * n, -1, block_size, dim)

    def reachable(x: Tensor) -> Tensor:  # keys or values -> [b*N, h, S + B, d]
        ctx = x[:, :, :ctx_len].unsqueeze(1).expand(-1, n, -1, -1, -1)
        own = x[:, :, ctx_len:].view(batch, x.shape[1], n, block_size, dim).transpose(1, 2)
        return torch.cat([ctx, own], dim=3).reshape(batch * n, -1, ctx_len + block_size, dim)

    out = F.scaled_dot_product_attention(
        per_block(q), reachable(k), reachable(v), attn_mask=mask, enable_gqa=True
    )
    return out.view(batch, n, heads, block_size, dim).transpose(1, 2).reshape(q.shape)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, eps=cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, eps=cfg.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        ctx: Tensor,
        rope_q: tuple[Tensor, Tensor],
        rope_kv: tuple[Tensor, Tensor],
        mask: Tensor | BlockMask,
    ) -> Tensor:
        batch, q_len, _ = x.shape
        d = self.cfg.head_dim
        kv_in = torch.cat([ctx, x], dim=1)
        q = self.q_norm(self.q_proj(x).view(batch, q_len, -1, d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(batch, kv_in.shape[1], -1, d)).transpose(1, 2)
        v = self.v_proj(kv_in).view(batch, kv_in.shape[1], -1, d).transpose(1, 2)
        # Norms and RoPE may run in fp32 under autocast: attend in the projections' dtype.
        q = apply_rope(q, *rope_q).to(v.dtype)
        k = apply_rope(k, *rope_kv).to(v.dtype)
        out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: Tensor,
        ctx: Tensor,
        rope_q: tuple[Tensor, Tensor],
        rope_kv: tuple[Tensor, Tensor],
        mask: Tensor | BlockMask,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, embed_weight: Tensor, lm_head_weight: Tensor) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, eps=cfg.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=cfg.init_std)
        # Frozen and shared with the target (the same tensor when on the same device and tied).
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)

    def forward(
        self,
        features: Tensor,
        block_ids: Tensor,
        block_pos: Tensor,
        mask: Tensor | BlockMask,
        layers: Sequence[Callable[..., Tensor]] | None = None,
    ) -> Tensor:
        """features [b, S, n*H], block ids and RoPE positions [b, Q] -> final hidden [b, Q, H].
        `layers` runs the decoder layers in place of `self.layers` (their compiled forms)."""
        ctx = self.hidden_norm(self.fc(features))
        x = F.embedding(block_ids, self.embed_weight)
        ctx_pos = torch.arange(features.shape[1], device=block_pos.device).expand(
            block_pos.shape[0], -1
        )
        rope_q = rope_tables(block_pos, self.cfg.head_dim, self.cfg.rope_theta)
        rope_kv = rope_tables(
            torch.cat([ctx_pos, block_pos], dim=1), self.cfg.head_dim, self.cfg.rope_theta
        )
        for layer in self.layers if layers is None else layers:
            x = layer(x, ctx, rope_q, rope_kv, mask)
        return self.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """Full logits; for drafting a few blocks only (training uses the chunked loss)."""
        return hidden.to(self.lm_head_weight.dtype) @ self.lm_head_weight.T
