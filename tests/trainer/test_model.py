"""The drafter: block-wise SDPA equals full-layout attention; forward and backward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dflash.mask import blockwise_dense_mask, dflash_mask_mod
from dflash.model import DrafterConfig, blockwise_sdpa
from dflash.objective import block_inputs, block_targets, sample_anchors, weighted_block_loss
from dflash.options import build_drafter


def full_layout_mask(anchors, kept, ctx_len, block):
    rows, n = anchors.shape
    mod = dflash_mask_mod(anchors, kept, ctx_len, block)
    b = torch.arange(rows).view(-1, 1, 1, 1)
    q = torch.arange(n * block).view(1, 1, -1, 1)
    kv = torch.arange(ctx_len + n * block).view(1, 1, 1, -1)
    return mod(b, torch.zeros((), dtype=torch.long), q, kv)


def test_blockwise_sdpa_equals_full_layout_attention():
    g = torch.Generator().manual_seed(0)
    rows, n, block, ctx_len, heads, kv_heads, dim = 2, 5, 4, 13, 4, 2, 8
    anchors = torch.sort(torch.randint(0, ctx_len, (rows, n), generator=g), dim=1).values
    kept = torch.rand(rows, n, generator=g) < 0.8
    q = torch.randn(rows, heads, n * block, dim, generator=g)
    k = torch.randn(rows, kv_heads, ctx_len + n * block, dim, generator=g)
    v = torch.randn(rows, kv_heads, ctx_len + n * block, dim, generator=g)
    full = F.scaled_dot_product_attention(
        q, k, v, attn_mask=full_layout_mask(anchors, kept, ctx_len, block), enable_gqa=True
    )
    local = blockwise_sdpa(q, k, v, blockwise_dense_mask(anchors, kept, ctx_len, block))
    assert torch.allclose(local, full, atol=1e-6)


def test_drafter_forward_backward(tiny_target):
    cfg = DrafterConfig.from_target(tiny_target.config, 2, 5, 8, tiny_target.mask_token_id)
    drafter = build_drafter(
        cfg, tiny_target.embed_weight(), tiny_target.lm_head_weight(), torch.device("cpu"), 0
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (2, 24), generator=g)
    loss_mask = torch.ones(2, 24, dtype=torch.bool)
    features, _ = tiny_target.forward(ids)
    assert features.shape == (2, 24, 5 * cfg.hidden_size)
    anchors, kept = sample_anchors(loss_mask, 6, g, fixed=False)
    block_ids, positions = block_inputs(ids, anchors, 8, cfg.mask_token_id)
    mask = blockwise_dense_mask(anchors, kept, 24, 8)
    hidden = drafter(features, block_ids, positions, mask)
    assert hidden.shape == (2, 6 * 8, cfg.hidden_size)
    labels, weights = block_targets(ids, loss_mask, anchors, kept, 8, 4.0)
    loss = weighted_block_loss(hidden, drafter.lm_head_weight, labels, weights)
    loss.backward()
    assert torch.isfinite(loss)
    for name, param in drafter.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    # The target's embedding and lm_head are frozen buffers: not trained, not checkpointed.
    assert not drafter.embed_weight.requires_grad and not drafter.lm_head_weight.requires_grad
    assert drafter.embed_weight.data_ptr() == tiny_target.embed_weight().data_ptr()
    assert not any("embed" in k or "lm_head" in k for k in drafter.state_dict())


def test_the_features_stop_after_the_last_feature_layer(tiny_target):
    """Training's features (hooks, the forward cut after the last feature layer) equal those of
    the whole forward with every hidden state; the layers past it never run; no hook stays."""
    layers = tiny_target.model.base_model.layers
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    full, _ = tiny_target.forward(ids, logits=True)
    hooks = [len(layer._forward_hooks) for layer in layers]  # transformers' own, if any
    past = list(layers)[tiny_target.layer_ids[-1] + 1 :]
    assert past, "the tiny target has layers past its last feature layer"
    ran: list[int] = []
    spies = [layer.register_forward_hook(lambda *_: ran.append(1)) for layer in past]
    try:
        features, logits = tiny_target.forward(ids)
    finally:
        for spy in spies:
            spy.remove()
    assert logits is None and ran == []
    assert torch.equal(features, full)
    assert [len(layer._forward_hooks) for layer in layers] == hooks


def test_compiled_target_layers_give_the_same_features_from_one_graph():
    """`compile_layers`: every decoder layer runs one compiled graph (the layers share their
    code), the features equal the uncompiled ones, and the logits forward and greedy decoding
    (other shapes, a KV cache) still run the uncompiled layers."""
    from torch._dynamo.utils import counters

    from dflash.target import load_target

    target = load_target("tiny", torch.device("cpu"), num_features=5, mask_token_id=None)
    layers = target.model.base_model.layers
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    eager, _ = target.forward(ids)
    graphs = counters["stats"]["unique_graphs"]
    target.compile_layers()
    compiled, _ = target.forward(ids)
    assert counters["stats"]["unique_graphs"] - graphs == 1
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert not any("forward" in vars(layer) for layer in layers)  # swapped back after the call
    target.forward(ids[:, :7], logits=True)
    target.greedy(ids[:, :5], new_tokens=3)
    assert counters["stats"]["unique_graphs"] - graphs == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}},
        # transformers 4.x: the scaling beside rope_theta, named `rope_type` or (before 4.45) `type`
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "rope_theta": 1e6},
        {"rope_scaling": {"type": "yarn", "factor": 4.0}, "rope_theta": 1e6},
    ],
)
def test_a_scaled_target_rope_is_refused_in_either_transformers_form(tiny_target, fields):
    """A YaRN target's scaling, as transformers 5 or 4.x writes it, is refused by name: the
    drafter would otherwise train with plain RoPE while the references apply YaRN."""
    config = dict(tiny_target.config.to_dict(), rope_parameters=None, rope_scaling=None)
    target = SimpleNamespace(**{**config, **fields})
    with pytest.raises(ValueError, match="target RoPE type 'yarn' is not supported"):
        DrafterConfig.from_target(target, 2, 5, 8, tiny_target.mask_token_id)
    # A 4.x config without scaling takes its rope_theta beside it.
    plain = SimpleNamespace(**{**config, "rope_theta": 1e6})
    assert DrafterConfig.from_target(plain, 2, 5, 8, tiny_target.mask_token_id).rope_theta == 1e6
