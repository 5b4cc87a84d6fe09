"""One drafter forward + loss on a feature batch: the part that train, warmup and tests share."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dflash.mask import attention_mask
from dflash.model import Drafter
from dflash.objective import block_inputs, block_targets, sample_anchors, weighted_block_loss
from dflash.pipeline import FeatureBatch


def static_shapes(device: torch.device, compile: bool) -> bool:
    """Fixed step shapes on a GPU (compiled flex_attention) or when compiling the drafter."""
    return device.type == "cuda" or compile


class DrafterStep:
    """Anchors -> blocks -> drafter -> weighted loss, on the drafter's device.

    On a GPU: flex_attention, bf16 autocast over fp32 master weights. On the CPU: SDPA with a
    dense mask in fp32 (flex_attention has no CPU backward). Compiled code (flex_attention
    always, the drafter's decoder layers with `compile`) wants static shapes: then every step
    samples exactly num_anchors slots per row, and the batches must have fixed rows and length
    too.
    `static` forces that elsewhere (several processes on the CPU: the same maths as on GPUs).
    `module` runs the drafter's forward: a DistributedDataParallel wrapper with several
    drafter ranks, else the drafter itself.

    The loss is global over the `ranks` drafter ranks: sum(w * CE) over every rank's batch
    divided by the weight sum of all of them (`weight_sum` all-reduces a rank's sum(w)), so N
    ranks train exactly like one rank on the union of their batches, however unequal their
    supervised tokens. DDP averages the ranks' gradients, so each rank's loss is
    ranks * sum(w * CE) / W: the average of their gradients is the global objective's, and the
    mean of their loss values is the global loss.
    """

    def __init__(
        self,
        drafter: Drafter,
        gamma: float,
        num_anchors: int,
        compile: bool,
        *,
        static: bool = False,
        module: nn.Module | None = None,
        ranks: int = 1,
        weight_sum: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.drafter = drafter
        self.gamma = gamma
        self.num_anchors = num_anchors
        self.device = drafter.fc.weight.device
        self.on_gpu = self.device.type == "cuda"
        self.static_shapes = static or static_shapes(self.device, compile)
        self.ranks = ranks
        self.weight_sum = weight_sum
        self.forward = drafter if module is None else module
        # Each decoder layer compiled on its own, not the whole drafter: the layers share one
        # code object, so Dynamo makes two graphs (the first layer, whose input needs no
        # gradient, and one every other layer reuses: its parameters are graph inputs), not
        # the unrolled stack. Measured: the tiny CPU drafter's first step ~15% sooner; an
        # H200's cold compile at the 8B shape no shorter (bench/trainer/README.md; the eager
        # step, which still compiles flex_attention, took over 90 s cold there too). The rest
        # (fc, two norms, the RoPE tables) runs eager: a few large kernels. The drafter itself
        # stays uncompiled (the warmup's canary runs it so).
        self.layers = (
            [torch.compile(layer, dynamic=False) for layer in drafter.layers] if compile else None
        )

    def loss(self, batch: FeatureBatch, generator: torch.Generator) -> Tensor:
        cfg = self.drafter.cfg
        anchors, kept = sample_anchors(
            batch.loss_mask, self.num_anchors, generator, fixed=self.static_shapes
        )
        ids, positions = block_inputs(batch.input_ids, anchors, cfg.block_size, cfg.mask_token_id)
        labels, weights = block_targets(
            batch.input_ids, batch.loss_mask, anchors, kept, cfg.block_size, self.gamma
        )
        normaliser = None
        if self.weight_sum is not None:  # one scalar all-reduce per step, the batch's sum(w)
            normaliser = self.weight_sum(weights.sum()) / self.ranks
        mask = attention_mask(
            anchors, kept, batch.input_ids.shape[1], cfg.block_size, flex=self.on_gpu
        )
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.on_gpu):
            hidden = self.forward(batch.features, ids, positions, mask, layers=self.layers)
            return weighted_block_loss(
                hidden, self.drafter.lm_head_weight, labels, weights, normaliser
            )
