"""Training data: a prepared token store, a JSONL file, or the target's own greedy
continuations (the batch order over them is dflash/order.py).

    python -m dflash.data prepare --out FOLDER [--tokenizer DIR] [--target-model M] INPUT...
    python -m dflash.data inspect [--verify] FOLDER

`prepare` turns JSONL (dflash/records.py names the forms) into a store that every process
reads in place (dflash/store.py); `inspect` prints a store's manifest as JSON. The trainer's
`--data` takes a store folder, or a JSONL file that it prepares once into `--data-cache`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _vocab_size(vocab_size: int | None, target_model: str | None) -> int | None:
    if vocab_size is not None:
        return vocab_size
    if target_model is not None:
        return int(load_target_config(target_model).vocab_size)
    return None


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.data", description="Prepare and inspect token stores."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser(
        "prepare",
        help="JSONL files into a store folder that the trainer reads in place (--data FOLDER)",
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
        vocab_size = _vocab_size(args.vocab_size, args.target_model)
        settings = Settings(args.max_seq_len, vocab_size, args.tokenizer)
        prepare(args.inputs, args.out, settings, workers=args.workers, force=args.force)
        return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
