"""The trainer's flags as typed values, built once from the parsed flags and passed inward.

`python -m dflash.train` parses its flags (dflash.flags), turns them into a `TrainConfig` and
hands only that on; no function past `main` sees the argparse namespace. `StepConfig`, the
flags the compiled drafter step depends on (flags.COMPILED), is the part the warm-up shares.
Defaults, bounds and help live in dflash.flags alone; this module only gives them types.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self


def _same_names(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """Each field of `cls` from the parsed flag of the same name (argparse checked the values)."""
    return {field.name: getattr(args, field.name) for field in fields(cls)}


@dataclass(frozen=True)
class StepConfig:
    """What one drafter step computes and compiles: the warm-up compiles with these, so its
    graphs are the ones training looks up."""

    target_model: str  # 'tiny' or a local Hugging Face model folder
    num_target_layers: int  # target layers whose hidden states form the context
    drafter_layers: int
    block_size: int  # the anchor plus block_size - 1 drafts
    gamma: float | None  # loss decay over block slots; None: by block size (options.gamma)
    max_seq_len: int
    token_budget: int | None  # padded tokens per step; None: by device (options.token_budget)
    num_anchors: int  # blocks sampled per sequence per step
    compile_drafter: bool
    compile_target: bool  # the target's decoder layers, for the features

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        return cls(**_same_names(cls, args))


@dataclass(frozen=True)
class TrainConfig(StepConfig):
    """Every flag of `python -m dflash.train`, the step's included."""

    # target
    mask_token_id: int | None  # None: the tokenizer's mask token, else the first row past it
    tokenizer: str | None  # for text data; None: the target folder
    target_random_init: bool  # developer flag: the target's config with random weights
    # GPU roles (both empty: CPU)
    target_gpus: str  # e.g. "0-3" or "0,1"
    drafter_gpus: str  # equal to target_gpus: colocated
    prefetch: int  # split mode: batches a target rank may run ahead of its drafter ranks
    dist_timeout: float  # seconds any wait between ranks may take
    cpu_ranks: bool  # tests: the GPU lists' ranks as CPU processes (gloo)
    # data
    data: str | None  # a store folder or a JSONL file, as given; None: self-generated
    data_cache: Path | None  # where a JSONL file's prepared copy goes
    verify_data: bool  # hash the whole store at start
    gen_samples: int
    gen_prompt_len: int
    gen_new_tokens: int
    # optimisation
    lr: float
    warmup_ratio: float  # share of max_steps warming the lr up
    grad_clip: float
    max_steps: int  # when to stop, and the length of the cosine schedule
    seed: int
    # run
    run_id: str
    checkpoint_dir: Path
    checkpoint_every: int
    keep_checkpoints: int  # 0: keep all
    status_file: Path
    status_interval: float  # seconds between status.json heartbeats
    log_every: int
    sleep_per_step: float  # developer flag: a slow release
    sleep_in_checkpoint: float  # developer flag: a stuck checkpoint save
    init_from: str | None  # a drafter folder, as given (the log names it so)
    throughput_window: int  # steps that tokens_per_s and stages average over

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        values = _same_names(cls, args)
        # What the trainer opens; --data and --init-from stay as given: the log names them so.
        values["checkpoint_dir"] = Path(args.checkpoint_dir)
        values["status_file"] = Path(args.status_file)
        values["data_cache"] = Path(args.data_cache) if args.data_cache else None
        return cls(**values)
