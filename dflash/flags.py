"""The command-line flags of train, warmup, eval and supervise: their names, types and bounds.

Stdlib only (no torch), so the toolkit can check a deployment's trainer flags against the very
release it deploys before anything changes on a target:

    python -m dflash.flags check train --max-steps 100 --seed 3

exits 0, or 2 naming each bad flag (an unknown name with the closest known one, a value of the
wrong type), and

    python -m dflash.flags describe train

prints the flags as JSON (name, flag, type, default, help, and which ones shape a training
step or are set by the launcher): the one description of the trainer's flags that the toolkit
reads (the warm-up's flags, the throughput shape's defaults, the flags run.sh sets itself).
`check supervise` and `describe supervise` do the same for the supervisor's restart policy
(dflash.supervise): its keys, bounds and defaults live here and nowhere else; the toolkit's
dflash_restart_policy passes only the keys a user sets.
Over 300 lines on purpose: it is the one table of every flag of these commands.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# Loss decay over block slots by block size (DFLASH.md); other sizes need --gamma.
DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}

CPU_TOKEN_BUDGET = 512  # keeps a CPU step of the tiny preset well under a second

# What one training step computes: two runs with the same values (and GPU layout) train the
# same workload, so their tokens/s compare (--token-budget's default depends on the device).
WORKLOAD = ("target_model", "max_seq_len", "token_budget", "num_anchors", "block_size",
            "drafter_layers")  # fmt: skip
# What the compiled drafter step depends on: the warm-up compiles it with these.
COMPILED = (*WORKLOAD, "num_target_layers", "gamma", "compile_drafter", "compile_target")
# Set by whoever launches the trainer, for every run: its GPUs and where its files go.
LAUNCHER = ("target_gpus", "drafter_gpus", "checkpoint_dir", "status_file", "run_id")


def _number(kind: type, low: float, strict: bool) -> Callable[[str], Any]:
    """An argparse type: argparse prefixes the flag name to the message."""
    bound = f"> {low}" if strict else f">= {low}"
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {noun}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"'{text}' is not a finite number")
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"'{text}' must be {bound}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_int = _number(int, 1, strict=False)
nonneg_int = _number(int, 0, strict=False)
positive_float = _number(float, 0.0, strict=True)
nonneg_float = _number(float, 0.0, strict=False)


def add_target_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("target")
    group.add_argument(
        "--target-model",
        default="tiny",
        help="'tiny' (a small random Qwen3) or a local Hugging Face model folder",
    )
    group.add_argument(
        "--num-target-layers",
        type=positive_int,
        default=5,
        help="target layers whose hidden states form the context (default 5)",
    )
    group.add_argument(
        "--mask-token-id",
        type=nonneg_int,
        default=None,
        help="embedding row of the MASK token (default: the tokenizer's mask "
        "token, else the first row past the tokenizer)",
    )
    group.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for text data (default: the target folder)",
    )


def add_drafter_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("drafter")
    group.add_argument(
        "--drafter-layers",
        type=positive_int,
        default=5,
        help="decoder layers of the drafter (default 5)",
    )
    group.add_argument(
        "--block-size",
        type=_number(int, 2, strict=False),
        default=16,
        help="tokens per block: the anchor plus block-size - 1 drafts (default 16)",
    )
    known = ", ".join(f"{b}: {g:g}" for b, g in DEFAULT_GAMMA.items())
    group.add_argument(
        "--gamma",
        type=positive_float,
        default=None,
        help=f"loss decay over block slots (default by block size: {known})",
    )


def add_shape_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("step shape")
    group.add_argument(
        "--max-seq-len",
        type=_number(int, 2, strict=False),
        default=3072,
        help="longest sequence; longer samples are cut. On a GPU (static shapes) every row is "
        "padded to it, so keep it near the data's length (default 3072)",
    )
    group.add_argument(
        "--token-budget",
        type=positive_int,
        default=None,
        help="padded tokens per step (default: --max-seq-len on a GPU, "
        f"{CPU_TOKEN_BUDGET} on the CPU)",
    )
    group.add_argument(
        "--num-anchors",
        type=positive_int,
        default=512,
        help="anchors (blocks) sampled per sequence per step (default 512)",
    )


def add_gen_args(parser: argparse.ArgumentParser, samples: int) -> None:
    group = parser.add_argument_group("self-generated data (used when --data is not given)")
    group.add_argument(
        "--gen-samples",
        type=positive_int,
        default=samples,
        help=f"random prompts to continue with the target (default {samples})",
    )
    group.add_argument(
        "--gen-prompt-len", type=positive_int, default=16, help="random prompt tokens (default 16)"
    )
    group.add_argument(
        "--gen-new-tokens",
        type=_number(int, 2, strict=False),
        default=48,
        help="greedy tokens generated by the target per prompt (default 48)",
    )


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.train", description="Train a DFlash drafter for a frozen target."
    )
    add_target_args(parser)
    gpus = parser.add_argument_group("GPU roles (both empty: CPU)")
    gpus.add_argument(
        "--target-gpus", default="", help="GPUs running the target, e.g. 0-3 or 0,1 (default: none)"
    )
    gpus.add_argument(
        "--drafter-gpus",
        default="",
        help="GPUs training the drafter; equal to --target-gpus = colocated",
    )
    gpus.add_argument(
        "--prefetch",
        type=positive_int,
        default=2,
        help="split mode: batches a target rank may run ahead of its drafter ranks (default 2)",
    )
    gpus.add_argument(
        "--dist-timeout",
        type=positive_float,
        default=1800.0,
        help="seconds any wait between ranks may take before the job fails, start-up "
        "(loading, generating data) and compilation included (default 1800)",
    )
    gpus.add_argument(  # tests: the ranks of the GPU lists as processes on the CPU (gloo)
        "--cpu-ranks", action="store_true", help=argparse.SUPPRESS
    )
    add_drafter_args(parser)
    add_shape_args(parser)
    parser.add_argument(
        "--compile-drafter",
        action="store_true",
        help="torch.compile the drafter step (static shapes)",
    )
    parser.add_argument(
        "--compile-target",
        action="store_true",
        help="torch.compile the target's decoder layers for the features (static shapes: a "
        "GPU, or with --compile-drafter)",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        default=None,
        help="a store folder (python -m dflash.data prepare) or a JSONL file, prepared once "
        "into --data-cache (default: the target's own continuations)",
    )
    data.add_argument(
        "--data-cache",
        default=None,
        help="where a JSONL file's prepared copy goes (default: $DFLASH_DATA_CACHE, which "
        "run.sh sets, else ~/.cache/dflash/data)",
    )
    data.add_argument(
        "--verify-data",
        action="store_true",
        help="hash the whole store at start against its manifest (default: sizes only)",
    )
    add_gen_args(parser, samples=512)
    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--lr", type=positive_float, default=6e-4, help="peak AdamW lr")
    optim.add_argument(
        "--warmup-ratio",
        type=nonneg_float,
        default=0.04,
        help="share of --max-steps spent warming the lr up (default 0.04)",
    )
    optim.add_argument("--grad-clip", type=positive_float, default=1.0)
    optim.add_argument(
        "--max-steps",
        type=positive_int,
        default=100_000,
        help="stop (checkpoint, status stopped, exit 0) after this many steps; "
        "also the length of the cosine schedule",
    )
    optim.add_argument("--seed", type=nonneg_int, default=0)
    run = parser.add_argument_group("run")
    run.add_argument("--run-id", default=f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    run.add_argument("--checkpoint-dir", default="checkpoints")
    run.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=1000,
        help="steps between periodic checkpoints (default 1000)",
    )
    run.add_argument(
        "--keep-checkpoints",
        type=nonneg_int,
        default=0,
        help="delete all but the newest N checkpoints (default 0: keep all)",
    )
    run.add_argument("--status-file", default="status.json")
    run.add_argument(
        "--status-interval",
        type=positive_float,
        default=2.0,
        help="seconds between status.json heartbeats (default 2)",
    )
    run.add_argument(
        "--log-every", type=positive_int, default=10, help="steps between log lines (default 10)"
    )
    run.add_argument(
        "--sleep-per-step",
        type=nonneg_float,
        default=0.0,
        help="developer flag: sleep this long after each step (a slow release)",
    )
    run.add_argument(
        "--sleep-in-checkpoint",
        type=nonneg_float,
        default=0.0,
        help="developer flag: sleep this long inside each checkpoint save (a stuck save)",
    )
    run.add_argument(
        "--target-random-init",
        action="store_true",
        help="developer flag: build --target-model's config.json with random weights "
        "(benchmarks; needs --mask-token-id)",
    )
    run.add_argument(
        "--init-from",
        default=None,
        help="start from this published or exported DFlash drafter folder (config.json + "
        "model.safetensors) when --checkpoint-dir holds no checkpoint yet",
    )
    run.add_argument(
        "--throughput-window",
        type=positive_int,
        default=20,
        help="steps that status.json's tokens_per_s and stages average over (default 20)",
    )
    return parser


def hang_after(text: str) -> float | None:
    """--hang-after: seconds, or auto (None: 10 median steps, at least 300 s)."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is neither seconds nor auto") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be seconds > 0, or auto")
    return value


def supervise_parser() -> argparse.ArgumentParser:
    """The supervisor's restart policy (dflash.supervise adds where it runs and what)."""
    parser = argparse.ArgumentParser(prog="python -m dflash.supervise", add_help=False)
    policy = parser.add_argument_group("restart policy")
    policy.add_argument(
        "--max-restarts",
        type=nonneg_int,
        default=5,
        help="restarts allowed within --window; one more failure is a crash loop and the run "
        "stays stopped (0: a crash ends the run) (default 5)",
    )
    policy.add_argument(
        "--window",
        type=positive_float,
        default=3600.0,
        help="seconds over which restarts are counted (default 3600)",
    )
    policy.add_argument(
        "--backoff",
        type=positive_float,
        default=10.0,
        help="seconds before a restart; doubles with each quick failure in a row (default 10)",
    )
    policy.add_argument(
        "--backoff-max",
        type=positive_float,
        default=300.0,
        help="seconds the back-off grows to at most, at least --backoff (default 300)",
    )
    policy.add_argument(
        "--hang-after",
        type=hang_after,
        default="auto",
        help="seconds without a training step after which the trainer is hung, or auto: 10 "
        "median steps, at least 300; a checkpoint save is hung after this (auto: 900 s), or 10 "
        "times the run's longest save if longer (default auto)",
    )
    return parser


def supervise_problems(args: argparse.Namespace) -> list[str]:
    """What the policy's flags say together that none says alone."""
    if args.backoff_max < args.backoff:
        return [
            f"--backoff-max {args.backoff_max:g} is under --backoff {args.backoff:g}: the "
            "back-off doubles from --backoff up to --backoff-max"
        ]
    return []


def _known_flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for action in parser._actions for s in action.option_strings if s != "-h")


def check(
    parser: argparse.ArgumentParser,
    argv: list[str],
    together: Callable[[argparse.Namespace], list[str]] | None = None,
) -> list[str]:
    """Every problem of `argv` for `parser`, each naming the flag; [] when it parses (and
    `together`, the flags' checks as a whole, finds nothing)."""
    known = _known_flags(parser)
    problems = []
    for word in argv:
        name = word.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            problems.append(
                f"unknown flag {name}" + (f" (did you mean {close[0]}?)" if close else "")
            )
    if problems:
        return problems

    class Refused(Exception):
        pass

    def refuse(message: str) -> None:
        raise Refused(message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        args = parser.parse_args(argv)
    except Refused as err:
        return [str(err)]
    return together(args) if together else []


def describe(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Every flag of `parser` as data: {dest: {flag, type, default, help, workload, compiled,
    launcher}}, and the device-dependent default of --token-budget."""
    flags = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        kind = "bool" if action.nargs == 0 else getattr(action.type, "__name__", "str")
        flags[action.dest] = {
            "flag": action.option_strings[0],
            "type": kind,
            # A launcher's flags default to values of one process (a run id with its pid).
            "default": None if action.dest in LAUNCHER else action.default,
            "help": None if action.help == argparse.SUPPRESS else action.help,
            "workload": action.dest in WORKLOAD,
            "compiled": action.dest in COMPILED,
            "launcher": action.dest in LAUNCHER,
        }
    return {"flags": flags, "token_budget": {"cpu": CPU_TOKEN_BUDGET, "gpu": "max_seq_len"}}


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "train": train_parser,
    "supervise": supervise_parser,
}
# A command's checks of its flags as a whole.
TOGETHER: dict[str, Callable[[argparse.Namespace], list[str]]] = {"supervise": supervise_problems}
USAGE = f"usage: python -m dflash.flags {{check,describe}} {{{','.join(PARSERS)}}} [FLAGS...]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("check", "describe") or argv[1] not in PARSERS:
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "describe":
        print(json.dumps(describe(PARSERS[argv[1]]()), indent=2))
        return 0
    problems = check(PARSERS[argv[1]](), argv[2:], TOGETHER.get(argv[1]))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
