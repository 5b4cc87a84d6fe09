"""The mask predicate and its CPU rendering against a brute-force reading of the spec."""

from __future__ import annotations

import torch

from dflash.mask import blockwise_dense_mask, dflash_mask_mod


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
