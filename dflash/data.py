"""Training data: JSONL files or the target's own greedy continuations, and the batch order.

A sample is token ids plus a loss mask (1 where the drafter should learn, e.g. the response).
JSONL lines take one of three forms:
  {"input_ids": [...], "loss_mask": [...]}   loss_mask optional (all ones)
  {"text": "..."}                            tokenized, all ones
  {"prompt": "...", "response": "..."}       tokenized, ones on the response only
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash.errors import ConfigError
from dflash.target import Target, load_tokenizer


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]
    loss_mask: list[int]

    def trainable(self) -> bool:
        """At least one anchor: two consecutive positions in the loss."""
        return any(a and b for a, b in zip(self.loss_mask, self.loss_mask[1:], strict=False))


def load_jsonl(
    path: Path, tokenizer_dir: str | None, vocab_size: int, max_len: int
) -> list[Sample]:
    """Read samples, truncated to max_len; untrainable ones are dropped."""
    if not path.is_file():
        raise ConfigError(f"--data '{path}': no such file")
    tokenizer = None
    samples = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"--data '{path}' line {number}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{where}: not JSON ({exc})") from None
            if not isinstance(record, dict):
                raise ConfigError(f"{where}: expected a JSON object")
            is_text = "input_ids" not in record and ("text" in record or "prompt" in record)
            if is_text and tokenizer is None:
                if tokenizer_dir is None:
                    raise ConfigError(f"{where}: text needs a tokenizer; pass --tokenizer FOLDER")
                tokenizer = load_tokenizer(tokenizer_dir)
            sample = _parse_record(record, tokenizer, where)
            if any(not 0 <= t < vocab_size for t in sample.input_ids):
                raise ConfigError(
                    f"{where}: a token id is outside the target's 0..{vocab_size - 1}"
                )
            sample = Sample(sample.input_ids[:max_len], sample.loss_mask[:max_len])
            if sample.trainable():
                samples.append(sample)
    if not samples:
        raise ConfigError(f"--data '{path}': no sample with two consecutive loss-mask tokens")
    return samples


def _parse_record(record: dict[str, Any], tokenizer: Any, where: str) -> Sample:
    if "input_ids" in record:
        ids = record["input_ids"]
        mask = record.get("loss_mask", [1] * len(ids))
        if not (_int_list(ids) and _int_list(mask)) or len(ids) != len(mask):
            raise ConfigError(
                f"{where}: input_ids and loss_mask must be integer lists of one length"
            )
        return Sample(ids, [int(bool(m)) for m in mask])
    if isinstance(record.get("text"), str):
        ids = tokenizer(record["text"], add_special_tokens=False)["input_ids"]
        return Sample(ids, [1] * len(ids))
    if isinstance(record.get("prompt"), str) and isinstance(record.get("response"), str):
        prompt = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
        response = tokenizer(record["response"], add_special_tokens=False)["input_ids"]
        return Sample(prompt + response, [0] * len(prompt) + [1] * len(response))
    raise ConfigError(f"{where}: needs input_ids, text, or prompt and response")


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


def self_generated(
    target: Target,
    count: int,
    prompt_len: int,
    new_tokens: int,
    seed: int,
    split: str,
    max_len: int,
    batch_size: int = 64,
) -> list[Sample]:
    """Random prompts and the target's greedy continuations (learnable, the target's own)."""
    eos = _eos_ids(target.config)
    samples = []
    all_prompts = random_prompts(target, count, prompt_len, seed, split)
    for prompts in all_prompts.split(batch_size):
        continuation = target.greedy(prompts.to(target.device), new_tokens).cpu()
        for prompt, cont in zip(prompts.tolist(), continuation.tolist(), strict=True):
            # Keep the continuation up to and including the first end-of-sequence token.
            end = next((i + 1 for i, t in enumerate(cont) if t in eos), len(cont))
            ids, mask = prompt + cont[:end], [0] * prompt_len + [1] * end
            samples.append(Sample(ids[:max_len], mask[:max_len]))
    return [s for s in samples if s.trainable()]


def random_prompts(target: Target, count: int, prompt_len: int, seed: int, split: str) -> Tensor:
    """[count, prompt_len] random token ids without the MASK id; `split` ("train" or "heldout")
    selects a distinct stream for the same seed."""
    generator = torch.Generator().manual_seed(seed * 2 + (split == "heldout"))
    vocab, mask_id = target.config.vocab_size, target.mask_token_id
    prompts = torch.randint(0, vocab - 1, (count, prompt_len), generator=generator)
    return prompts + (prompts >= mask_id).long()  # skip the MASK id


def _eos_ids(config: Any) -> set[int]:
    eos = config.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {eos}


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
    """

    def __init__(
        self,
        samples: list[Sample],
        token_budget: int,
        pad_to: int,
        fixed_rows: int | None,
        seed: int,
    ) -> None:
        self.samples = samples
        self.token_budget = token_budget
        self.pad_to = pad_to
        self.fixed_rows = fixed_rows
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._batches = self._cut(self.epoch)

    def _padded(self, length: int) -> int:
        return -(-length // self.pad_to) * self.pad_to

    def _cut(self, epoch: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in torch.randperm(len(self.samples), generator=generator).tolist():
            length = self._padded(len(self.samples[i].input_ids))
            full = (
                len(current) == self.fixed_rows
                if self.fixed_rows
                else (len(current) + 1) * max(longest, length) > self.token_budget
            )
            if current and full:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, length)
        batches.append(current)
        return batches

    def _advance(self) -> list[int]:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self._cut(self.epoch)
        self.index += 1
        return self._batches[self.index - 1]

    def skip(self) -> None:
        """Pass over the next batch without building it (another data shard's)."""
        self._advance()

    def next(self) -> Batch:
        picked = [self.samples[i] for i in self._advance()]
        rows = self.fixed_rows or len(picked)
        seq_len = self._padded(max(len(s.input_ids) for s in picked))
        input_ids = torch.zeros(rows, seq_len, dtype=torch.long)
        loss_mask = torch.zeros(rows, seq_len, dtype=torch.bool)
        for row, sample in enumerate(picked):
            n = len(sample.input_ids)
            input_ids[row, :n] = torch.tensor(sample.input_ids)
            loss_mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.bool)
        return Batch(input_ids, loss_mask, sum(len(s.input_ids) for s in picked))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "num_samples": len(self.samples)}

    def load_state_dict(self, state: dict[str, int]) -> bool:
        """Continue where a checkpoint stopped; False (start over) when the data changed."""
        if state["num_samples"] != len(self.samples):
            return False
        self.epoch, self.index = state["epoch"], state["index"]
        self._batches = self._cut(self.epoch)
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

    def state_dict(self) -> dict[str, int]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> bool:
        return self.order.load_state_dict(state)
