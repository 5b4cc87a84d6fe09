"""Training data: a prepared token store, a JSONL file, or the target's own greedy
continuations; and the batch order over it.

    python -m dflash.data prepare --out FOLDER [--tokenizer DIR] [--target-model M] INPUT...
    python -m dflash.data inspect [--verify] FOLDER

`prepare` turns JSONL (dflash/records.py names the forms) into a store that every process
maps (dflash/store.py); `inspect` prints a store's manifest as JSON. The trainer's `--data`
takes a store folder, or a JSONL file that it prepares once into `--data-cache`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dflash.errors import ConfigError
from dflash.prepare import cached_store, default_workers, prepare
from dflash.records import Settings
from dflash.store import TokenStore
from dflash.target import TINY, Target, load_target_config

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
    """--data: a store folder (mapped as it is) or a JSONL file (its prepared copy)."""
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


def _vocab_size(args: argparse.Namespace) -> int | None:
    if args.vocab_size is not None:
        return int(args.vocab_size)
    if args.target_model is not None:
        return int(load_target_config(args.target_model).vocab_size)
    return None


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.data", description="Prepare and inspect token stores."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser(
        "prepare", help="JSONL files into a store folder that the trainer maps (--data FOLDER)"
    )
    make.add_argument("inputs", nargs="+", type=Path, metavar="INPUT.jsonl")
    make.add_argument("--out", type=Path, required=True, help="the store folder to write")
    make.add_argument("--tokenizer", default=None, help="tokenizer folder, for text records")
    vocab = make.add_mutually_exclusive_group()
    vocab.add_argument(
        "--target-model",
        default=None,
        help=f"check token ids against this target's vocabulary ('{TINY}' or a model folder)",
    )
    vocab.add_argument("--vocab-size", type=int, default=None, help="check ids below this")
    make.add_argument(
        "--max-seq-len", type=int, default=3072, help="cut longer samples (default 3072)"
    )
    make.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help=f"parsing processes (default {default_workers()}: the CPUs, up to 8)",
    )
    make.add_argument("--force", action="store_true", help="replace an existing store")
    look = commands.add_parser("inspect", help="print a store's manifest as JSON")
    look.add_argument("store", type=Path)
    look.add_argument(
        "--verify", action="store_true", help="hash every array again against the manifest"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = cli_parser().parse_args(argv)
    try:
        if args.command == "inspect":
            store = TokenStore.open(args.store, verify=args.verify)
            print(json.dumps({"path": str(args.store.resolve()), **store.manifest}, indent=2))
            return 0
        if args.max_seq_len < 2 or args.workers < 1:
            raise ConfigError(
                f"--max-seq-len {args.max_seq_len} / --workers {args.workers}: the longest "
                "sample needs 2 or more tokens and the workers 1 or more"
            )
        settings = Settings(args.max_seq_len, _vocab_size(args), args.tokenizer)
        prepare(args.inputs, args.out, settings, workers=args.workers, force=args.force)
        return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
