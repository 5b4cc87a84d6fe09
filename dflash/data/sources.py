"""Where a run's samples come from: a prepared token store, a JSONL file (prepared once into
`--data-cache`), or the target's own greedy continuations (the batch order over them is
dflash/data/order.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash.data.prepare import cached_store
from dflash.data.records import Settings
from dflash.data.store import TokenStore
from dflash.errors import ConfigError
from dflash.target import Target, load_target_config

SELF_GENERATED = "self_generated"


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]
    loss_mask: list[int]

    def trainable(self) -> bool:
        """At least one anchor: two consecutive positions in the loss."""
        return any(a and b for a, b in zip(self.loss_mask, self.loss_mask[1:], strict=False))


def sample_store(samples: list[Sample], **manifest: Any) -> TokenStore:
    """An in-memory store of samples (self-generated data, tests)."""
    return TokenStore.from_samples([(s.input_ids, s.loss_mask) for s in samples], **manifest)


def default_data_cache() -> Path:
    """Where a JSONL file's prepared copy goes: $DFLASH_DATA_CACHE (run.sh sets it inside the
    state root), else the user's cache folder."""
    if os.environ.get("DFLASH_DATA_CACHE"):
        return Path(os.environ["DFLASH_DATA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dflash" / "data"


def open_data(
    data: str, tokenizer: str | None, vocab_size: int, max_seq_len: int, log: Any,
    cache_dir: Path | None = None, verify: bool = False,
) -> TokenStore:  # fmt: skip
    """--data: a store folder (read in place) or a JSONL file (its prepared copy)."""
    path = Path(data)
    if path.is_dir():
        store = TokenStore.open(path, verify=verify)
    else:
        settings = Settings(max_seq_len=max_seq_len, vocab_size=vocab_size, tokenizer=tokenizer)
        store = cached_store(path, cache_dir or default_data_cache(), settings, log, verify)
        store.kind, store.named = "jsonl", data
    top = store.manifest["max_token_id"]
    if top >= vocab_size:
        raise ConfigError(
            f"--data '{data}': token id {top} is outside the target's vocabulary "
            f"0..{vocab_size - 1}; the data were tokenized for another model"
        )
    cut = store.manifest.get("settings", {}).get("max_seq_len")
    if cut is not None and cut < max_seq_len:
        log(f"data: samples were cut at {cut} tokens when prepared (--max-seq-len {max_seq_len})")
    return store


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


def vocab_size_of(vocab_size: int | None, target_model: str | None) -> int | None:
    if vocab_size is not None:
        return vocab_size
    if target_model is not None:
        return int(load_target_config(target_model).vocab_size)
    return None
