"""The canary's reference: a compiled drafter step against the same step run uncompiled.

A compiled graph loaded from the cache may run and still compute the wrong numbers (a damaged
entry, a compiler's bug): finite values prove nothing. Both canaries compare values: the
warmup's (dflash.warmup: the whole step, gradients into .grad) and a warm trainer's at its first
step (`compare_first_step`: on the batch that step trains on, before its optimizer runs).

The bounds by device type, TOLERANCE = (relative loss error, relative L2 error of the
gradients): the CPU runs both steps in fp32 on the dense SDPA path, which differ by the order of
float sums only (measured ~1e-7); a GPU runs both in bf16 (autocast) with flex_attention, where
the Qwen3-8B drafter shape measured 2.0e-2 on the gradients (dflash/warmup.py says more).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch
from torch import Tensor

from dflash.pipeline import FeatureBatch
from dflash.step import DrafterStep

TOLERANCE = {"cpu": (1e-3, 1e-3), "cuda": (1e-3, 5e-2)}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class StepRun:
    loss: float
    grads: Tensor  # the compared gradients, flattened, in fp32
    seconds: float  # forward and backward


def run_step(step: DrafterStep, batch: FeatureBatch, seed: int) -> StepRun:
    """One forward and backward from zeroed gradients, timed (the warmup's)."""
    step.drafter.zero_grad(set_to_none=True)
    start = time.perf_counter()
    loss = step.loss(batch, torch.Generator().manual_seed(seed))
    loss.backward()
    synchronize(step.device)
    seconds = time.perf_counter() - start
    grads = torch.cat([p.grad.flatten().float() for p in step.drafter.parameters()])
    return StepRun(loss.item(), grads, seconds)


def uncompiled(step: DrafterStep) -> DrafterStep:
    """The same step without torch.compile of the drafter, on the same anchors (static shapes)."""
    return DrafterStep(
        step.drafter, step.gamma, step.num_anchors, compile=False, static=step.static_shapes
    )


def json_number(value: float) -> float | str:
    """NaN and infinity as text ("nan"): JSON has no such numbers."""
    return value if math.isfinite(value) else str(value)


def relative_error(got: Tensor, want: Tensor) -> float:
    """Relative L2 error of `got` against `want`, in fp32 (NaN where either holds one)."""
    diff = torch.linalg.vector_norm((got - want).float())
    return (diff / torch.linalg.vector_norm(want.float()).clamp_min(1e-12)).item()


def canary(compiled: StepRun, eager: StepRun, device: torch.device) -> dict[str, Any]:
    """Do the compiled and the eager step agree (NaN never does)? The warmup's JSON `canary`."""
    loss_bound, grad_bound = TOLERANCE[device.type]
    loss_err = abs(compiled.loss - eager.loss) / max(abs(eager.loss), 1e-12)
    grad_err = relative_error(compiled.grads, eager.grads)
    return {
        "ok": loss_err <= loss_bound and grad_err <= grad_bound,
        "loss_compiled": json_number(compiled.loss),
        "loss_eager": json_number(eager.loss),
        "loss_rel_err": json_number(loss_err),
        "grad_rel_err": json_number(grad_err),
        "tolerance": {"loss_rel_err": loss_bound, "grad_rel_err": grad_bound},
    }


def local_run(step: DrafterStep, batch: FeatureBatch, seed: int, params: list[Tensor]) -> StepRun:
    """This rank's loss alone and its gradients for `params`, through autograd.grad: nothing is
    accumulated into .grad (the training step's own backward is untouched, and a DDP wrapper's
    hooks never see it) and no collective runs (ranks=1, no weight_sum)."""
    start = time.perf_counter()
    loss = step.loss(batch, torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(loss, params)
    synchronize(step.device)
    flat = torch.cat([g.flatten().float() for g in grads])
    return StepRun(loss.item(), flat, time.perf_counter() - start)


def compare_first_step(step: DrafterStep, batch: FeatureBatch, seed: int) -> dict[str, Any]:
    """A warm trainer's first batch through its compiled layers (the graphs the cache gave it)
    and through the same layers uncompiled: the warmup's `canary` dict. The gradients compared
    are those of the first two decoder layers: each compiled graph is there (the first layer's,
    and the one every later layer shares), and reaching them runs every layer's backward."""
    compiled = DrafterStep(
        step.drafter, step.gamma, step.num_anchors, compile=False, static=step.static_shapes
    )
    compiled.layers = step.layers  # the training step's compiled layers, as the cache gave them
    params = [p for layer in step.drafter.layers[:2] for p in layer.parameters() if p.requires_grad]
    got = local_run(compiled, batch, seed, params)
    want = local_run(uncompiled(step), batch, seed, params)
    return canary(got, want, step.device)
