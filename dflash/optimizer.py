"""The optimizer step: gradient clipping then AdamW, in as few passes over memory as the device
allows.

At the Qwen3-8B drafter shape (1.05 B fp32 parameters) the step after the backward is memory
bound: clipping reads every gradient for the norm, then reads and writes it again to scale it;
AdamW reads the gradient, the parameter and both moments and writes three of them. Fused AdamW
(`fused=True`, used on a GPU) takes a `grad_scale` it divides each gradient by inside its one
pass (the hook GradScaler unscales through), so clipping's scale costs no pass of its own: the
optimizer gets grad_scale = 1 / min(1, max_norm / (norm + 1e-6)), the same clip factor
clip_grad_norm_ multiplies by (a division instead of a multiplication: within fp32 rounding).
Unfused (the CPU), clip_grad_norm_ scales the gradients as before.
"""

from __future__ import annotations

import torch
from torch import Tensor

CLIP_EPS = 1e-6  # clip_grad_norm_'s own


def clip_and_step(
    optimizer: torch.optim.Optimizer, params: list[Tensor], max_norm: float
) -> Tensor:
    """Clip the gradients of `params` to `max_norm` (their total L2 norm) and take the
    optimizer's step; returns the norm before clipping (non-finite when a gradient is)."""
    if not optimizer.defaults.get("fused"):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return norm
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    # The step reads it on the device: no host sync, as clip_grad_norm_'s clamp has none.
    optimizer.grad_scale = torch.clamp((norm + CLIP_EPS) / max_norm, min=1.0)  # type: ignore[attr-defined]
    optimizer.step()
    return norm
