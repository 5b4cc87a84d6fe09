"""Clipping folded into fused AdamW (dflash/optimizer.py) is the optimizer step it replaces:
clip_grad_norm_ then AdamW's step, on the CPU's own fused AdamW kernel (the same grad_scale
contract as CUDA's), over several steps with the clip active and idle."""

from __future__ import annotations

import copy

import pytest
import torch

from dflash.optimizer import clip_and_step


def model_and_batches(seed: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    return model, [torch.randn(32, 64) * 3 for _ in range(5)]


def trained(model: torch.nn.Module, batches, max_norm: float, folded: bool):
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0, fused=True)
    norms = []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        if folded:
            norms.append(clip_and_step(optimizer, params, max_norm).item())
        else:
            norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
            optimizer.step()
    return params, norms


@pytest.mark.parametrize("max_norm", [0.05, 1e6], ids=["clipping", "not-clipping"])
def test_folded_clipping_is_clip_then_step(max_norm):
    model, batches = model_and_batches(seed=3)
    want, want_norms = trained(copy.deepcopy(model), batches, max_norm, folded=False)
    got, got_norms = trained(model, batches, max_norm, folded=True)
    assert got_norms == pytest.approx(want_norms, rel=1e-6)
    if max_norm < 1:
        assert min(want_norms) > max_norm, "the clip never acted: this case proves nothing"
    for a, b in zip(got, want, strict=True):
        error = (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()
        assert error < 1e-6, error


def test_an_unfused_optimizer_clips_the_gradients_themselves():
    model, batches = model_and_batches(seed=4)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2, foreach=True)
    model(batches[0]).square().mean().backward()
    norm = clip_and_step(optimizer, params, 0.01)
    after = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
    )
    assert norm > 0.01 and after.item() == pytest.approx(0.01, rel=1e-4)
    assert getattr(optimizer, "grad_scale", None) is None
