"""python -m dflash.data: prepare and inspect token stores.

    python -m dflash.data prepare --out FOLDER [--tokenizer DIR] [--target-model M] INPUT...
    python -m dflash.data inspect [--verify] FOLDER

`prepare` turns JSONL (dflash/data/records.py names the forms) into a store that every process
reads in place (dflash/data/store.py); `inspect` prints a store's manifest as JSON. The
trainer's `--data` takes a store folder, or a JSONL file that it prepares once into
`--data-cache`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash.data.prepare import default_workers, prepare
from dflash.data.records import Settings
from dflash.data.sources import vocab_size_of
from dflash.data.store import TokenStore
from dflash.errors import ConfigError
from dflash.target import TINY


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
        vocab_size = vocab_size_of(args.vocab_size, args.target_model)
        settings = Settings(args.max_seq_len, vocab_size, args.tokenizer)
        prepare(args.inputs, args.out, settings, workers=args.workers, force=args.force)
        return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
