"""python -m dflash.eval: acceptance length tau of a drafter checkpoint on held-out data.

tau is measured by running speculative decoding with greedy verification: per verification step,
accepted = the number of leading draft tokens equal to the target's greedy tokens, plus the one
token the target adds itself. tau = generated tokens / verification steps (1 = no speed-up).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash import checkpoint
from dflash.data import load_jsonl, random_prompts
from dflash.errors import ConfigError
from dflash.flags import nonneg_int, positive_int
from dflash.mask import attention_mask
from dflash.model import Drafter, DrafterConfig
from dflash.options import build_drafter
from dflash.target import TINY, Target, load_target
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


@torch.no_grad()
def speculative_decode(
    target: Target, drafter: Drafter, prompt: list[int], max_new_tokens: int
) -> tuple[int, int]:
    """Generate max_new_tokens greedily with drafts; returns (tokens generated, verify steps)."""
    device = target.device
    features, logits = target.forward(torch.tensor([prompt], device=device), logits=True)
    seq = [*prompt, int(logits[0, -1].argmax())]
    ctx = features  # target features of seq[:-1]
    generated, steps = 1, 0
    while generated < max_new_tokens:
        draft = draft_block(drafter, ctx.to(drafter.fc.weight.device), seq[-1])
        anchor = len(seq) - 1
        features, logits = target.forward(torch.tensor([seq + draft], device=device), logits=True)
        greedy = logits[0, anchor:].argmax(-1).tolist()  # the target's token for each next slot
        accepted = 0
        while accepted < len(draft) and draft[accepted] == greedy[accepted]:
            accepted += 1
        seq += [*draft[:accepted], greedy[accepted]]
        ctx = features[:, : len(seq) - 1]
        generated += accepted + 1
        steps += 1
    return generated - 1, steps  # the prefill's token was not drafted


def acceptance_length(
    target: Target, drafter: Drafter, prompts: list[list[int]], max_new_tokens: int
) -> dict[str, Any]:
    tokens = steps = 0
    for prompt in prompts:
        got, took = speculative_decode(target, drafter, prompt, max_new_tokens)
        tokens, steps = tokens + got, steps + took
    return {
        "tau": tokens / max(1, steps),
        "tokens": tokens,
        "verify_steps": steps,
        "samples": len(prompts),
    }


def heldout_prompts(args: argparse.Namespace, target: Target) -> list[list[int]]:
    """Prompts: the part before the loss mask of each held-out sample."""
    if not args.data:
        prompts = random_prompts(
            target, args.num_samples, args.gen_prompt_len, args.seed, "heldout"
        )
        return prompts.tolist()
    tokenizer = args.tokenizer or (None if args.target_model == TINY else args.target_model)
    samples = load_jsonl(Path(args.data), tokenizer, target.config.vocab_size, 1 << 30)
    prompts = [s.input_ids[: s.loss_mask.index(1)] for s in samples[: args.num_samples]]
    if not all(prompts):
        raise ConfigError(f"--data '{args.data}': every sample needs a prompt before its loss mask")
    return prompts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.eval", description="Acceptance length tau of a drafter checkpoint."
    )
    parser.add_argument(
        "--target-model", default=None, help="default: the target the checkpoint was trained for"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint file, or a folder (its newest complete checkpoint)",
    )
    parser.add_argument(
        "--checkpoint-dir", default="checkpoints", help="used when --checkpoint is not given"
    )
    parser.add_argument("--gpu", default="", help="one GPU index (default: the CPU)")
    parser.add_argument(
        "--data", default=None, help="held-out JSONL (default: self-generated held-out prompts)"
    )
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--num-samples", type=positive_int, default=16)
    parser.add_argument("--max-new-tokens", type=positive_int, default=48)
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


def load_checkpoint(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    where = Path(args.checkpoint or args.checkpoint_dir)
    if where.is_file():
        try:
            return where, torch.load(where, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ConfigError(f"--checkpoint '{where}': cannot be read ({exc})") from exc
    found = checkpoint.load_latest(where, warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    if found is None:
        flag = "--checkpoint" if args.checkpoint else "--checkpoint-dir"
        raise ConfigError(f"{flag} '{where}': no complete checkpoint there")
    return found


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        gpus = parse_gpu_list("--gpu", args.gpu)
        if len(gpus) > 1:
            raise ConfigError(f"--gpu '{args.gpu}': eval runs on one GPU")
        require_gpus("--gpu", args.gpu, gpus)
        device = device_of(gpus)
        path, payload = load_checkpoint(args)
        cfg = DrafterConfig(**payload["drafter_config"])
        args.target_model = args.target_model or payload["target_model"]
        target = load_target(args.target_model, device, cfg.num_features, cfg.mask_token_id)
        if (
            target.config.hidden_size != cfg.hidden_size
            or target.config.vocab_size != cfg.vocab_size
        ):
            raise ConfigError(
                f"--target-model '{args.target_model}': hidden/vocab size differ from the "
                f"checkpoint's ({cfg.hidden_size}/{cfg.vocab_size})"
            )
        drafter = build_drafter(cfg, target.embed_weight(), target.lm_head_weight(), device, 0)
        drafter.load_state_dict(payload["drafter"])
        result = acceptance_length(
            target, drafter, heldout_prompts(args, target), args.max_new_tokens
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result.update(
        {
            "checkpoint": str(path),
            "step": payload["step"],
            "block_size": cfg.block_size,
            "target_model": args.target_model,
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
