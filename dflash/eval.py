"""python -m dflash.eval: acceptance length tau of a drafter on held-out data.

tau is measured by running speculative decoding with greedy verification, by the rules of the
public DFlash benchmark (`dflash_generate`): per verification step, the acceptance length is the
number of leading draft tokens equal to the target's greedy tokens, plus the one token the
target adds itself; a sample is verified while fewer than max_new_tokens + 1 tokens are out
(so the last step runs when generated == max_new_tokens) and stops after the step that
produced a stop token (the tokenizer's EOS). Two aggregations: `tau`, the mean over prompts of
each prompt's mean acceptance length (the figure the benchmark prints), and `tau_pooled`, all
acceptance lengths over all verification steps (1 = no speed-up).

The drafter is a training checkpoint (a file, or a folder's newest one) or a published or
exported DFlash drafter folder (`dflash.public_format`). Just over 300 lines: the benchmark's
rules, the drafter's loading and the CLI read best side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dflash import checkpoint
from dflash.data import random_prompts
from dflash.data.prepare import load_in_memory
from dflash.data.records import Settings
from dflash.data.store import TokenStore
from dflash.errors import ConfigError
from dflash.flags import nonneg_int, positive_int
from dflash.mask import attention_mask
from dflash.model import Drafter, DrafterConfig
from dflash.options import build_drafter
from dflash.public_format import is_drafter_folder, read_folder, target_problems
from dflash.target import TINY, Target, load_target, load_tokenizer
from dflash.topology import device_of, parse_gpu_list, require_gpus


@torch.no_grad()
def draft_block(drafter: Drafter, features: Tensor, last_token: int) -> list[int]:
    """Draft B - 1 tokens after `last_token`, whose position is features.shape[1]."""
    cfg, device = drafter.cfg, features.device
    anchor = features.shape[1]
    block_ids = torch.full((1, cfg.block_size), cfg.mask_token_id, device=device)
    block_ids[0, 0] = last_token
    positions = anchor + torch.arange(cfg.block_size, device=device)[None]
    anchors = torch.tensor([[anchor]], device=device)
    kept = torch.ones_like(anchors, dtype=torch.bool)
    on_gpu = device.type == "cuda"
    # One block over a context that grows every call: the dense path, which never recompiles.
    mask = attention_mask(anchors, kept, anchor, cfg.block_size, flex=False)
    with torch.autocast(features.device.type, torch.bfloat16, enabled=on_gpu):
        hidden = drafter(features, block_ids, positions, mask)
    return drafter.logits(hidden[0, 1:]).argmax(-1).tolist()


@dataclass(frozen=True)
class Decoded:
    tokens: list[int]  # the prefill's token, then every verification step's
    lengths: list[int]  # acceptance length of each verification step


@torch.no_grad()
def speculative_decode(
    target: Target,
    drafter: Drafter,
    prompt: list[int],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] = frozenset(),
) -> Decoded:
    """Greedy speculative decoding of one prompt: the tokens after it and the acceptance length
    of each verification step (accepted drafts + 1)."""
    device = target.device
    features, logits = target.forward(torch.tensor([prompt], device=device), logits=True)
    seq = [*prompt, int(logits[0, -1].argmax())]
    ctx = features  # target features of seq[:-1]
    lengths: list[int] = []
    # The block starts at the last token, seq[-1]; verify while that start is inside the
    # max_new_tokens after the prompt, as the benchmark's `while start < max_length`.
    while len(seq) - 1 - len(prompt) < max_new_tokens:
        draft = draft_block(drafter, ctx.to(drafter.fc.weight.device), seq[-1])
        anchor = len(seq) - 1
        features, logits = target.forward(torch.tensor([seq + draft], device=device), logits=True)
        greedy = logits[0, anchor:].argmax(-1).tolist()  # the target's token for each next slot
        accepted = 0
        while accepted < len(draft) and draft[accepted] == greedy[accepted]:
            accepted += 1
        seq += [*draft[:accepted], greedy[accepted]]
        ctx = features[:, : len(seq) - 1]
        lengths.append(accepted + 1)
        if stop_token_ids.intersection(seq[len(prompt) :]):
            break  # the benchmark checks after each step, the prefill's token included
    return Decoded(seq[len(prompt) :], lengths)


def tau_summary(per_prompt: list[list[int]], block_size: int) -> dict[str, Any]:
    """The two published aggregations of per-step acceptance lengths, and their counts."""
    lengths = [n for steps in per_prompt for n in steps]
    prompt_taus = [sum(steps) / len(steps) for steps in per_prompt if steps]
    return {
        "tau": sum(prompt_taus) / max(1, len(prompt_taus)),
        "tau_pooled": sum(lengths) / max(1, len(lengths)),
        "tau_per_prompt": prompt_taus,
        "tokens": sum(lengths),
        "verify_steps": len(lengths),
        "samples": len(per_prompt),
        "acceptance_length_counts": [lengths.count(n) for n in range(block_size + 1)],
    }


def acceptance_length(
    target: Target,
    drafter: Drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] = frozenset(),
) -> dict[str, Any]:
    per_prompt = [
        speculative_decode(target, drafter, prompt, max_new_tokens, stop_token_ids).lengths
        for prompt in prompts
    ]
    return tau_summary(per_prompt, drafter.cfg.block_size)


def default_stop_tokens(target: Target, tokenizer_dir: str | None) -> frozenset[int]:
    """The tokenizer's EOS and the target's generation-config EOS ids (none for `tiny`)."""
    ids: set[int] = set()
    generation = getattr(target.model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer_dir is not None:
        try:
            tokenizer = load_tokenizer(tokenizer_dir)
        except ConfigError:
            tokenizer = None  # a weights-only folder: the generation config says enough
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
    return frozenset(int(i) for i in ids)


def stop_token_list(text: str) -> frozenset[int]:
    """--stop-token-ids: comma-separated token ids ("none" for no stop tokens)."""
    if text.strip() == "none":
        return frozenset()
    try:
        return frozenset(int(word) for word in text.split(",") if word.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a list of token ids like 2,151645 (or none)"
        ) from None


def heldout_prompts(
    target: Target,
    data: str | None,
    tokenizer: str | None,
    num_samples: int,
    prompt_len: int,
    seed: int,
) -> list[list[int]]:
    """Prompts: the part before the loss mask of each held-out sample (`data`, else random
    prompts of `prompt_len` tokens from the held-out stream of `seed`)."""
    if not data:
        prompts = random_prompts(target, num_samples, prompt_len, seed, "heldout")
        return prompts.tolist()
    path = Path(data)
    settings = Settings(
        max_seq_len=1 << 30, vocab_size=target.config.vocab_size, tokenizer=tokenizer
    )
    store = TokenStore.open(path) if path.is_dir() else load_in_memory(path, settings)
    prompts = []
    for index in range(min(num_samples, store.num_samples)):
        ids, mask = store.sample(index)
        prompts.append(ids[: int(np.argmax(mask))].tolist())
    if not all(prompts):
        raise ConfigError(f"--data '{data}': every sample needs a prompt before its loss mask")
    return prompts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.eval", description="Acceptance length tau of a drafter."
    )
    parser.add_argument(
        "--target-model", default=None, help="default: the target the drafter was trained for"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint file, a folder of checkpoints (its newest complete one), or a "
        "published or exported DFlash drafter folder (config.json + model.safetensors)",
    )
    parser.add_argument(
        "--checkpoint-dir", default="checkpoints", help="used when --checkpoint is not given"
    )
    parser.add_argument("--gpu", default="", help="one GPU index (default: the CPU)")
    parser.add_argument(
        "--data",
        default=None,
        help="held-out JSONL or store folder (default: self-generated held-out prompts)",
    )
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--num-samples", type=positive_int, default=16)
    parser.add_argument("--max-new-tokens", type=positive_int, default=48)
    parser.add_argument(
        "--stop-token-ids",
        type=stop_token_list,
        default=None,
        help="a sample stops after the step that produced one of these (default: the "
        "tokenizer's EOS and the target's generation-config EOS ids; none for no stop)",
    )
    parser.add_argument(
        "--seed",
        type=nonneg_int,
        default=0,
        help="the training --seed: held-out prompts differ from its prompts",
    )
    parser.add_argument(
        "--gen-prompt-len",
        type=positive_int,
        default=16,
        help="random prompt tokens of self-generated held-out prompts",
    )
    parser.add_argument("--out", default="-", help="JSON result file (default: stdout)")
    return parser


def load_checkpoint(path: str | None, checkpoint_dir: str) -> tuple[Path, dict[str, Any]]:
    """A training checkpoint's payload, or the same fields from a drafter folder: `path`
    (--checkpoint), else the newest complete checkpoint in `checkpoint_dir`."""
    where = Path(path or checkpoint_dir)
    if is_drafter_folder(where):
        public = read_folder(where)
        origin = public.provenance or {}
        return where, {
            "drafter_config": public.cfg.as_dict(),
            "drafter": public.state,
            "step": origin.get("step"),
            "target_model": (origin.get("trained_by") or {}).get("target_model"),
            "public": public,
        }
    if where.is_file():
        try:
            return where, torch.load(where, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ConfigError(f"--checkpoint '{where}': cannot be read ({exc})") from exc
    found = checkpoint.load_latest(where, warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    if found is None:
        flag = "--checkpoint" if path else "--checkpoint-dir"
        raise ConfigError(f"{flag} '{where}': no complete checkpoint there")
    return found


def load_drafter(
    path: Path, payload: dict[str, Any], target_model: str | None, device: torch.device
) -> tuple[Target, Drafter]:
    """The drafter to measure and the target it drafts for (`target_model`, else the one the
    checkpoint names), checked to fit each other."""
    cfg = DrafterConfig(**payload["drafter_config"])
    target_model = target_model or payload["target_model"]
    if not target_model:
        raise ConfigError(f"--checkpoint '{path}' does not name its target; pass --target-model")
    target = load_target(target_model, device, cfg.num_features, cfg.mask_token_id)
    public = payload.get("public")
    problems = target_problems(public, target.config, target_model) if public else []
    if (target.config.hidden_size, target.config.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
        problems.append(
            f"--target-model '{target_model}': hidden/vocab size differ from the "
            f"drafter's ({cfg.hidden_size}/{cfg.vocab_size})"
        )
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))
    drafter = build_drafter(cfg, target.embed_weight(), target.lm_head_weight(), device, 0)
    drafter.load_state_dict(payload["drafter"])
    return target, drafter


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        gpus = parse_gpu_list("--gpu", args.gpu)
        if len(gpus) > 1:
            raise ConfigError(f"--gpu '{args.gpu}': eval runs on one GPU")
        require_gpus("--gpu", args.gpu, gpus)
        path, payload = load_checkpoint(args.checkpoint, args.checkpoint_dir)
        target, drafter = load_drafter(path, payload, args.target_model, device_of(gpus))
        tokenizer = args.tokenizer or (None if target.name == TINY else target.name)
        stops = args.stop_token_ids
        if stops is None:
            stops = default_stop_tokens(target, tokenizer)
        prompts = heldout_prompts(
            target, args.data, tokenizer, args.num_samples, args.gen_prompt_len, args.seed
        )
        result = acceptance_length(target, drafter, prompts, args.max_new_tokens, stops)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result.update(
        {
            "checkpoint": str(path),
            "step": payload["step"],
            "block_size": drafter.cfg.block_size,
            "target_model": target.name,
            "max_new_tokens": args.max_new_tokens,
            "stop_token_ids": sorted(stops),
        }
    )
    text = json.dumps(result, indent=2)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
