"""The batch order: a reproducible, resumable shuffle of a token store's samples, cut into
batches as they are taken, and its shards over the drafter ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dflash.data.store import TokenStore
from dflash.errors import ConfigError


@dataclass
class Batch:
    input_ids: Tensor  # [rows, S], right-padded
    loss_mask: Tensor  # [rows, S] bool
    num_tokens: int  # real (unpadded) tokens


class BatchOrder:
    """A reproducible, resumable batch order: each epoch is a seeded shuffle cut into batches.

    A batch holds as many samples as fit `token_budget` counting padding (rows x padded length).
    With `fixed_rows` every batch has exactly that many rows, each padded to `pad_to`, so shapes
    never change (torch.compile); otherwise the length is rounded up to a multiple of `pad_to`.
    Samples are cut at `max_len`; those without an anchor before it are left out.

    Batches are cut from the shuffled order as they are taken, so an epoch costs one
    permutation of the sample indices (no per-sample or per-token Python objects), and the
    position in it is the whole state: a checkpoint resumes there, on the same data only.
    """

    def __init__(
        self,
        data: TokenStore,
        token_budget: int,
        pad_to: int,
        fixed_rows: int | None,
        seed: int,
        max_len: int | None = None,
    ) -> None:
        self.data = data
        self.token_budget = token_budget
        self.pad_to = pad_to
        self.fixed_rows = fixed_rows
        self.seed = seed
        self.max_len = max_len or int(np.iinfo(np.int32).max)
        anchors = np.asarray(data.first_anchor)
        self.indices = np.flatnonzero((anchors >= 0) & (anchors <= self.max_len - 2))
        if not len(self.indices):
            raise ConfigError(
                f"no sample of the data has an anchor within --max-seq-len {self.max_len}"
            )
        self.lengths = np.minimum(data.lengths[self.indices], self.max_len)
        self.padded = -(-self.lengths // pad_to) * pad_to
        self.epoch = 0
        self.index = 0  # batches taken in this epoch
        self.position = 0  # samples of this epoch's permutation taken
        self._perm = self._permutation(self.epoch)

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    @property
    def data_sha256(self) -> str:
        return str(self.data.manifest["content_sha256"])

    def _permutation(self, epoch: int) -> np.ndarray:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator).numpy()

    def _cut(self) -> np.ndarray:
        """The next batch's positions in `indices`, taken from the permutation."""
        start, end = self.position, self.position
        if self.fixed_rows:
            end = min(start + self.fixed_rows, self.num_samples)
        else:
            longest = 0
            while end < self.num_samples:
                length = int(self.padded[self._perm[end]])
                if end > start and (end - start + 1) * max(longest, length) > self.token_budget:
                    break
                longest = max(longest, length)
                end += 1
        self.position = end
        return self._perm[start:end]

    def _advance(self) -> np.ndarray:
        if self.position >= self.num_samples:
            self.epoch, self.index, self.position = self.epoch + 1, 0, 0
            self._perm = self._permutation(self.epoch)
        self.index += 1
        return self._cut()

    def skip(self) -> None:
        """Pass over the next batch without building it (another data shard's)."""
        self._advance()

    def next(self) -> Batch:
        picked = self._advance()
        lengths = self.lengths[picked]
        rows = self.fixed_rows or len(picked)
        seq_len = int(self.padded[picked].max())
        input_ids = torch.zeros(rows, seq_len, dtype=torch.long)
        loss_mask = torch.zeros(rows, seq_len, dtype=torch.bool)
        for row, (position, n) in enumerate(zip(picked.tolist(), lengths.tolist(), strict=True)):
            ids, mask = self.data.sample(int(self.indices[position]))
            input_ids[row, :n] = torch.from_numpy(ids[:n].astype(np.int64))
            loss_mask[row, :n] = torch.from_numpy(mask[:n].astype(bool))
        return Batch(input_ids, loss_mask, int(lengths.sum()))

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "index": self.index,
            "position": self.position,
            "num_samples": self.num_samples,
            "data_sha256": self.data_sha256,
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Continue where a checkpoint stopped; False (a new order) unless it is the same data
        (content hash) and sample count."""
        if (
            state.get("data_sha256") != self.data_sha256
            or state.get("num_samples") != self.num_samples
            or "position" not in state
        ):
            return False
        self.epoch, self.index, self.position = state["epoch"], state["index"], state["position"]
        self._perm = self._permutation(self.epoch)
        return True


class ShardedOrder:
    """Data parallelism over one global order: each step takes `num_shards` consecutive batches
    of it, batch k going to shard k. Every rank advances the same order, so its state is the
    same on all ranks and one checkpoint resumes them all. One shard: exactly `order.next()`."""

    def __init__(self, order: BatchOrder, num_shards: int) -> None:
        self.order = order
        self.num_shards = num_shards

    def next_step(self, shards: list[int]) -> list[Batch]:
        """The batches of these shards (in that order) for one step; the others are skipped."""
        built: dict[int, Batch] = {}
        for shard in range(self.num_shards):
            if shard in shards:
                built[shard] = self.order.next()
            else:
                self.order.skip()
        return [built[shard] for shard in shards]

    @property
    def data(self) -> dict[str, Any]:
        """What the run trains on (the store's summary, and how many of its samples the order
        takes at this --max-seq-len), for status.json and checkpoints."""
        return {**self.order.data.summary(), "samples_in_order": self.order.num_samples}

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def position(self) -> dict[str, int]:
        """The numeric part of the state, which travels in every feature header."""
        return {k: v for k, v in self.state_dict().items() if k != "data_sha256"}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        return self.order.load_state_dict(state)
