"""The DFlash attention mask: one predicate, rendered as a flex block mask or a dense SDPA mask.

Keys are laid out [ctx_0 .. ctx_{S-1} | block_0 | block_1 | ..]; queries are the block slots.
A query of block j sees key kv iff block j is kept and either kv is a context position before
the anchor (kv < a_j: the anchor's own target state does not exist at inference time), or kv
lies in block j itself (bidirectional inside a block; blocks never see each other).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def dflash_mask_mod(anchors: Tensor, kept: Tensor, ctx_len: int, block_size: int) -> MaskMod:
    """The mask predicate (b, h, q_idx, kv_idx) -> bool for anchors/kept of shape [batch, N]."""
    last_block = anchors.shape[1] - 1

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        # flex pads queries to its tile size: clamp so padded rows index a real block.
        block = (q_idx // block_size).clamp(max=last_block)
        before_anchor = (kv_idx < ctx_len) & (kv_idx < anchors[b, block])
        same_block = (kv_idx >= ctx_len) & ((kv_idx - ctx_len) // block_size == block)
        return kept[b, block] & (before_anchor | same_block)

    return mask_mod


@functools.cache
def compiled_create_block_mask() -> Any:
    """create_block_mask, compiled once per process (eager it materialises the dense mask)."""
    return torch.compile(create_block_mask)


def flex_block_mask(anchors: Tensor, kept: Tensor, ctx_len: int, block_size: int) -> BlockMask:
    """Block-sparse mask over the full key layout for flex_attention (GPU path); H=None: every
    head shares it."""
    rows, n = anchors.shape
    q_len = n * block_size
    return compiled_create_block_mask()(
        dflash_mask_mod(anchors, kept, ctx_len, block_size),
        B=rows,
        H=None,
        Q_LEN=q_len,
        KV_LEN=ctx_len + q_len,
        device=anchors.device,
    )


def blockwise_dense_mask(anchors: Tensor, kept: Tensor, ctx_len: int, block_size: int) -> Tensor:
    """Boolean SDPA mask [rows * N, 1, B, ctx_len + B] for the CPU path.

    A block never sees other blocks, so the CPU attends each block to its reachable keys only:
    the context followed by its own block (`model.blockwise_sdpa`). The mask is the same
    predicate evaluated at the global indices of those keys.
    """
    rows, n = anchors.shape
    device = anchors.device
    b = torch.arange(rows, device=device).view(rows, 1, 1, 1)
    block = torch.arange(n, device=device).view(1, n, 1, 1)
    slot = torch.arange(block_size, device=device).view(1, 1, -1, 1)
    key = torch.arange(ctx_len + block_size, device=device).view(1, 1, 1, -1)
    own_key = ctx_len + block * block_size + (key - ctx_len)
    global_kv = torch.where(key < ctx_len, key, own_key)
    h = torch.zeros((), dtype=torch.long, device=device)
    mask_mod = dflash_mask_mod(anchors, kept, ctx_len, block_size)
    mask = mask_mod(b, h, block * block_size + slot, global_kv)
    return mask.reshape(rows * n, 1, block_size, ctx_len + block_size)


def attention_mask(
    anchors: Tensor, kept: Tensor, ctx_len: int, block_size: int, flex: bool
) -> Tensor | BlockMask:
    build = flex_block_mask if flex else blockwise_dense_mask
    return build(anchors, kept, ctx_len, block_size)
