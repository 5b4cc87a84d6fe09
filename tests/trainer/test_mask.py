"""The mask predicate and its CPU rendering against a brute-force reading of the spec; the GPU's
block mask against torch's create_block_mask of the same predicate."""

from __future__ import annotations

import itertools

import torch
from torch.nn.attention.flex_attention import create_block_mask

from dflash.mask import blockwise_dense_mask, dflash_mask_mod, flex_block_mask
from dflash.objective import sample_anchors


def brute_force(anchors: torch.Tensor, kept: torch.Tensor, ctx_len: int, block: int):
    """[rows, N*B, S + N*B], straight from DFLASH.md, one key at a time."""
    rows, n = anchors.shape
    out = torch.zeros(rows, n * block, ctx_len + n * block, dtype=torch.bool)
    for b in range(rows):
        for q in range(n * block):
            j = q // block
            for kv in range(ctx_len + n * block):
                if not kept[b, j]:
                    continue
                if kv < ctx_len:
                    out[b, q, kv] = kv < anchors[b, j]
                else:
                    out[b, q, kv] = (kv - ctx_len) // block == j
    return out


def random_case(seed: int, rows: int = 2, n: int = 4, ctx_len: int = 11, block: int = 3):
    g = torch.Generator().manual_seed(seed)
    anchors = torch.sort(torch.randint(0, ctx_len, (rows, n), generator=g), dim=1).values
    kept = torch.rand(rows, n, generator=g) < 0.75
    return anchors, kept, ctx_len, block


def test_predicate_matches_brute_force_on_random_anchors():
    for seed in range(5):
        anchors, kept, ctx_len, block = random_case(seed)
        rows, n = anchors.shape
        mod = dflash_mask_mod(anchors, kept, ctx_len, block)
        b = torch.arange(rows).view(-1, 1, 1)
        q = torch.arange(n * block).view(1, -1, 1)
        kv = torch.arange(ctx_len + n * block).view(1, 1, -1)
        dense = mod(b, torch.zeros((), dtype=torch.long), q, kv)
        assert torch.equal(dense, brute_force(anchors, kept, ctx_len, block))


def test_padded_queries_are_clamped_to_the_last_block():
    anchors, kept, ctx_len, block = random_case(0)
    n = anchors.shape[1]
    mod = dflash_mask_mod(anchors, kept, ctx_len, block)
    zero = torch.zeros((), dtype=torch.long)
    kv = torch.arange(ctx_len + n * block)
    padded = mod(zero, zero, torch.tensor(n * block + 5), kv)  # past the last real query
    assert torch.equal(padded, mod(zero, zero, torch.tensor(n * block - 1), kv))


def test_blockwise_dense_mask_is_the_predicate_on_reachable_keys():
    for seed in range(5):
        anchors, kept, ctx_len, block = random_case(seed)
        rows, n = anchors.shape
        full = brute_force(anchors, kept, ctx_len, block)
        local = blockwise_dense_mask(anchors, kept, ctx_len, block)
        assert local.shape == (rows * n, 1, block, ctx_len + block)
        for b in range(rows):
            for j in range(n):
                own = slice(ctx_len + j * block, ctx_len + (j + 1) * block)
                rows_q = full[b, j * block : (j + 1) * block]
                expected = torch.cat([rows_q[:, :ctx_len], rows_q[:, own]], dim=1)
                assert torch.equal(local[b * n + j, 0], expected)
        # Nothing is lost: every key a block may see is a context key or one of its own.
        assert local.sum() == full.sum()


BLOCK_MASK_FIELDS = [
    f"{full}{side}_{what}" for full in ("", "full_") for side in ("kv", "q")
    for what in ("num_blocks", "indices")
]  # fmt: skip


def test_flex_block_mask_is_the_one_create_block_mask_builds():
    """The block mask worked out from the anchors equals create_block_mask's evaluation of the
    predicate, tile by tile, partial and full tiles apart: context lengths on and off the
    128-key tile, blocks that divide a tile, straddle tiles or exceed one, rows with every
    anchor kept, some, and none."""
    g = torch.Generator().manual_seed(0)
    shapes = itertools.product([64, 300, 1000], [4, 13, 16], [4, 10, 16, 200], [1.0, 0.5, 0.0])
    for ctx_len, n, block, share in shapes:
        loss_mask = (
            torch.rand(2, ctx_len, generator=g) < share
            if share < 1
            else torch.ones(2, ctx_len, dtype=torch.bool)
        )
        anchors, kept = sample_anchors(loss_mask, n, g, fixed=True)
        q_len = n * block
        expected = create_block_mask(
            dflash_mask_mod(anchors, kept, ctx_len, block),
            B=2, H=None, Q_LEN=q_len, KV_LEN=ctx_len + q_len, device="cpu",
        )  # fmt: skip
        built = flex_block_mask(anchors, kept, ctx_len, block)
        case = f"ctx_len {ctx_len}, {n} blocks of {block}, loss share {share}"
        for field in BLOCK_MASK_FIELDS:
            assert torch.equal(getattr(built, field), getattr(expected, field)), (case, field)
        assert (built.seq_lengths, built.BLOCK_SIZE) == (expected.seq_lengths, expected.BLOCK_SIZE)
