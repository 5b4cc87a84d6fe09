"""The DFlash attention mask: one predicate, rendered as a flex block mask or a dense SDPA mask.

Keys are laid out [ctx_0 .. ctx_{S-1} | block_0 | block_1 | ..]; queries are the block slots.
A query of block j sees key kv iff block j is kept and either kv is a context position before
the anchor (kv < a_j: the anchor's own target state does not exist at inference time), or kv
lies in block j itself (bidirectional inside a block; blocks never see each other).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

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


TILE = 128  # flex_attention's sparse block: the mask says which TILE x TILE tiles to visit


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """[rows, 1, Tq, Tk] bool -> BlockMask's (count per query tile, key tile indices, the
    visited ones first in ascending order), as create_block_mask orders them."""
    dense = dense.to(torch.int32)
    indices = torch.argsort(dense, dim=-1, descending=True, stable=True)
    return dense.sum(-1).to(torch.int32), indices.to(torch.int32)


def flex_block_mask(anchors: Tensor, kept: Tensor, ctx_len: int, block_size: int) -> BlockMask:
    """Block-sparse mask over the full key layout for flex_attention (GPU path), every head
    sharing it: the same BlockMask create_block_mask(dflash_mask_mod(...)) builds, worked out
    from the anchors in a few small tensor operations instead of evaluating the predicate on
    every (query, key) pair. (Compiled, create_block_mask took 217 of the 233 s of an H200's
    cold first step at the Qwen3-8B shape; eager it materialises the dense mask.)

    Per query tile t and key tile j = [lo, lo + TILE): the query rows of t belong to the blocks
    first[t]..last[t]; row q of block b sees [0, a_b) and its own block's keys, when kept. The
    tile is visited when some row sees some key of it: a kept anchor past lo, or a kept block
    whose own keys meet it; it is full (no predicate needed) when every row sees every key:
    all rows real, all keys real, and each part of the tile covered (context keys below every
    row's anchor; own keys inside one block that holds every row)."""
    n = anchors.shape[1]
    device = anchors.device
    q_len, kv_len = n * block_size, ctx_len + n * block_size
    q_tiles, kv_tiles = -(-q_len // TILE), -(-kv_len // TILE)
    # The blocks each query tile's real rows belong to: first[t]..last[t].
    tile_start = torch.arange(q_tiles, device=device) * TILE
    first = tile_start // block_size
    last = (torch.clamp(tile_start + TILE, max=q_len) - 1) // block_size
    span = -(-TILE // block_size) + 1  # most blocks a tile can touch
    members = torch.clamp(first[:, None] + torch.arange(span, device=device), max=last[:, None])
    seen = torch.where(kept, anchors, torch.zeros_like(anchors))  # a kept block sees [0, a)
    a_max = seen[:, members].amax(-1)[:, :, None]  # [rows, Tq, 1]
    a_min = seen[:, members].amin(-1)[:, :, None]  # 0 where any block of the tile is not kept
    lo = torch.arange(kv_tiles, device=device) * TILE  # [Tk]
    hi = lo + TILE
    # Context keys of tile j: [lo, min(hi, ctx_len)). Shapes [rows, Tq, Tk] from here.
    visit = (lo < ctx_len) & (a_max > lo)
    ctx_full = (lo >= ctx_len) | (a_min >= torch.clamp(hi, max=ctx_len))
    # Own keys of block b: [own[b], own[b] + block_size).
    own = ctx_len + torch.arange(n, device=device) * block_size
    start = own[members][:, :, None]  # [Tq, span, 1]
    meets = (start < hi) & (start + block_size > lo)  # [Tq, span, Tk]
    visit |= (meets & kept[:, members, None]).any(2)
    # Full own keys: every row of the tile in one kept block whose keys cover the tile's.
    one_block = ((first == last)[None, :] & kept[:, first])[:, :, None]
    own_first = own[first][:, None]  # [Tq, 1]
    covered = (own_first <= torch.clamp(lo, min=ctx_len)) & (hi <= own_first + block_size)
    own_full = (hi <= ctx_len) | (one_block & covered)
    whole = ((tile_start + TILE) <= q_len)[:, None] & (hi <= kv_len)  # no padding in it
    full = visit & whole & ctx_full & own_full
    partial = visit & ~full
    kv_num, kv_idx = _ordered(partial[:, None])
    full_num, full_idx = _ordered(full[:, None])
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=(TILE, TILE),
        mask_mod=dflash_mask_mod(anchors, kept, ctx_len, block_size),
        seq_lengths=(q_len, kv_len),
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
