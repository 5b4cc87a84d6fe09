"""What the drafter learns: anchors, block inputs, same-position labels and the weighted loss."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor


def sample_anchors(
    loss_mask: Tensor, num_anchors: int, generator: torch.Generator, fixed: bool
) -> tuple[Tensor, Tensor]:
    """Up to num_anchors random anchors a per row with loss_mask[a] and loss_mask[a+1], sorted.

    Returns anchors and kept, both [rows, N]; unused slots come last with kept False.
    N is num_anchors when `fixed` (static shapes for torch.compile), else the most any row
    can use, so the CPU does not pay for empty slots.
    """
    rows, seq_len = loss_mask.shape
    valid = torch.zeros_like(loss_mask)
    valid[:, :-1] = loss_mask[:, :-1] & loss_mask[:, 1:]
    if fixed:
        n = num_anchors  # no count read back: on a GPU that would wait for the queued work
    else:
        n_valid = int(valid.sum(1).max()) if rows else 0
        n = max(1, min(num_anchors, n_valid))
    # Random keys; invalid positions get keys above every valid one, so topk skips them.
    keys = torch.rand(rows, seq_len, generator=generator).to(loss_mask.device)
    keys = keys + (~valid).to(keys.dtype) * 2.0
    picked = keys.topk(min(n, seq_len), dim=1, largest=False).indices
    kept = valid.gather(1, picked)
    # Sort kept anchors ascending and push unused slots to the end.
    order_key = torch.where(kept, picked, picked + seq_len)
    order = order_key.argsort(dim=1)
    anchors, kept = picked.gather(1, order), kept.gather(1, order)
    anchors = torch.where(kept, anchors, torch.zeros_like(anchors))
    if n > seq_len:
        pad = n - seq_len
        anchors = torch.cat([anchors, anchors.new_zeros(rows, pad)], dim=1)
        kept = torch.cat([kept, kept.new_zeros(rows, pad)], dim=1)
    return anchors, kept


def block_inputs(
    input_ids: Tensor, anchors: Tensor, block_size: int, mask_token_id: int
) -> tuple[Tensor, Tensor]:
    """Block token ids [anchor token, MASK x (B-1)] and RoPE positions a_j + k, both [rows, N*B]."""
    rows, n = anchors.shape
    ids = torch.full(
        (rows, n, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device
    )
    ids[:, :, 0] = input_ids.gather(1, anchors)
    offsets = torch.arange(block_size, device=anchors.device)
    positions = anchors[:, :, None] + offsets
    return ids.view(rows, -1), positions.view(rows, -1)


def block_targets(
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Tensor,
    kept: Tensor,
    block_size: int,
    gamma: float,
) -> tuple[Tensor, Tensor]:
    """Labels and loss weights [rows, N, B]: slot k of block j predicts x[a_j + k].

    w_jk = kept_j * [k >= 1] * [a_j + k < S] * loss_mask[a_j + k] * exp(-(k - 1) / gamma).
    """
    rows, n = anchors.shape
    seq_len = input_ids.shape[1]
    k = torch.arange(block_size, device=anchors.device)
    pos = anchors[:, :, None] + k
    inside = pos < seq_len
    flat = pos.clamp(max=seq_len - 1).view(rows, -1)
    labels = input_ids.gather(1, flat).view(rows, n, block_size)
    in_loss = loss_mask.gather(1, flat).view(rows, n, block_size)
    decay = torch.exp(-(k - 1).to(torch.float32) / gamma) * (k >= 1)
    weights = (kept[:, :, None] & inside & in_loss).to(torch.float32) * decay
    return labels, weights


def chunk_loss_and_grad(
    logits: Tensor, labels: Tensor, scale: Tensor, want_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """sum(scale * CE) of one chunk of logits and, when `want_grad`, the gradient for those
    logits ((softmax - onehot) * scale, in the logits' dtype), the softmax in fp32."""
    wide = logits.float()
    lse = wide.logsumexp(dim=-1)
    target_logit = wide.gather(1, labels[:, None]).squeeze(1)
    loss = ((lse - target_logit) * scale).sum()
    if not want_grad:
        return loss, None
    onehot = torch.zeros_like(wide).scatter_(1, labels[:, None], 1.0)
    grad = ((wide - lse[:, None]).exp() - onehot) * scale[:, None]
    return loss, grad.to(logits.dtype)


@functools.cache
def compiled_chunk_loss_and_grad() -> Any:
    """On a GPU the chunk's softmax work fused into a few kernels: read the bf16 logits, write
    their bf16 gradient, instead of a dozen passes over an fp32 copy (measured on an H200 at
    the Qwen3-8B shape: 15% of the drafter step)."""
    compiled = torch.compile(chunk_loss_and_grad)

    def run(logits: Tensor, labels: Tensor, scale: Tensor, want_grad: bool) -> Any:
        # The rows differ from step to step (the supervised slots): one graph for any number
        # of rows, the same in the warmup and in training, not one graph per count.
        for tensor in (logits, labels, scale):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return compiled(logits, labels, scale, want_grad)

    return run


class _WeightedLMHeadCE(torch.autograd.Function):
    """sum(scale * CE(hidden @ W^T, labels)) computed chunk by chunk.

    The gradient for `hidden` is computed in the forward, chunk by chunk, so no logits are kept
    for the backward: peak memory is one chunk of logits, never rows x B x vocab. W is frozen.
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, labels: Tensor, scale: Tensor, chunk: int
    ) -> Tensor:
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        per_chunk = compiled_chunk_loss_and_grad() if hidden.is_cuda else chunk_loss_and_grad
        for start in range(0, hidden.shape[0], chunk):
            end = start + chunk
            logits = hidden[start:end].to(weight.dtype) @ weight.T
            loss, grad_logits = per_chunk(
                logits, labels[start:end], scale[start:end], grad is not None
            )
            total += loss
            if grad_logits is not None:
                grad[start:end] = (grad_logits @ weight).to(hidden.dtype)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return (None if grad is None else grad * grad_out), None, None, None, None


def weighted_block_loss(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    weights: Tensor,
    normaliser: Tensor | None = None,
    chunk: int = 1024,
) -> Tensor:
    """sum(w * CE) / normaliser over the block slots; only slots with w > 0 reach the lm_head.

    The normaliser defaults to this batch's sum(w): L = sum(w * CE) / sum(w). With several
    drafter ranks the step passes the global weight sum over the number of ranks (see
    `dflash.step.DrafterStep`).
    """
    w = weights.reshape(-1)
    picked = w.nonzero().squeeze(1)
    if picked.numel() == 0:
        # Nothing to learn from this batch: a zero that still reaches every parameter.
        return hidden.sum() * 0.0
    total = w.sum() if normaliser is None else normaliser
    h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, picked)
    scale = w.index_select(0, picked) / total
    return _WeightedLMHeadCE.apply(h, lm_head_weight, labels.reshape(-1)[picked], scale, chunk)
