"""Anchors, same-position labels, loss weights (hand-checked) and the chunked loss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dflash.objective import block_inputs, block_targets, sample_anchors, weighted_block_loss

MASK = 99


def test_labels_and_weights_on_a_hand_checked_example():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    anchors = torch.tensor([[1, 3, 0]])
    kept = torch.tensor([[True, True, False]])
    labels, weights = block_targets(ids, loss_mask, anchors, kept, block_size=4, gamma=2.0)
    # Same position: slot k of the block anchored at a predicts x[a + k].
    assert labels[0, 0].tolist() == [11, 12, 13, 14]
    assert labels[0, 1].tolist()[:3] == [13, 14, 15]
    e = math.exp
    expected = [
        [0.0, 1.0, e(-1 / 2), e(-2 / 2)],  # slot 0 never counts; decay exp(-(k-1)/gamma)
        [0.0, 1.0, 0.0, 0.0],  # x[5] is outside the loss mask, position 6 is past S
        [0.0, 0.0, 0.0, 0.0],  # not kept
    ]
    assert torch.allclose(weights[0], torch.tensor(expected))

    block_ids, positions = block_inputs(ids, anchors, block_size=4, mask_token_id=MASK)
    assert block_ids.view(3, 4).tolist() == [
        [11, MASK, MASK, MASK],
        [13, MASK, MASK, MASK],
        [10, MASK, MASK, MASK],
    ]
    assert positions.view(3, 4).tolist() == [[1, 2, 3, 4], [3, 4, 5, 6], [0, 1, 2, 3]]


def test_anchors_are_valid_sorted_and_padded():
    g = torch.Generator().manual_seed(0)
    loss_mask = torch.zeros(3, 40, dtype=torch.bool)
    loss_mask[0, 5:30] = True
    loss_mask[1, 10:13] = True  # two valid anchors: 10 and 11
    loss_mask[2, 20] = True  # none: a lone loss token has no successor
    anchors, kept = sample_anchors(loss_mask, num_anchors=8, generator=g, fixed=False)
    assert anchors.shape == (3, 8)
    for row in range(3):
        chosen = anchors[row][kept[row]].tolist()
        assert chosen == sorted(chosen)
        assert all(loss_mask[row, a] and loss_mask[row, a + 1] for a in chosen)
        assert not kept[row][len(chosen) :].any()  # unused slots come last
    assert kept.sum(1).tolist() == [8, 2, 0]
    assert sorted(anchors[1][kept[1]].tolist()) == [10, 11]

    fixed, fixed_kept = sample_anchors(loss_mask, num_anchors=64, generator=g, fixed=True)
    assert fixed.shape == fixed_kept.shape == (3, 64)  # static shapes even past S


def test_chunked_loss_matches_full_logits_in_value_and_gradient():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 12, 8, generator=g, requires_grad=True)
    weight = torch.randn(30, 8, generator=g)
    labels = torch.randint(0, 30, (2, 3, 4), generator=g)
    weights = torch.rand(2, 3, 4, generator=g) * (torch.rand(2, 3, 4, generator=g) > 0.3)

    loss = weighted_block_loss(hidden, weight, labels, weights, chunk=5)
    loss.backward()
    chunked_grad = hidden.grad.clone()

    hidden.grad = None
    ce = F.cross_entropy(hidden.reshape(-1, 8) @ weight.T, labels.reshape(-1), reduction="none")
    reference = (ce * weights.reshape(-1)).sum() / weights.sum()
    reference.backward()
    assert torch.allclose(loss, reference, rtol=1e-5)
    assert torch.allclose(chunked_grad, hidden.grad, rtol=1e-4, atol=1e-6)
