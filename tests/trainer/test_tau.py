"""tau as the public DFlash benchmark reports it: its two aggregations on a hand-made acceptance
sequence, the final verification step at generated == max_new_tokens, stop tokens."""

from __future__ import annotations

import pytest

from dflash.data import random_prompts
from dflash.eval import speculative_decode, stop_token_list, tau_summary
from dflash.model import DrafterConfig
from dflash.options import build_drafter


def test_pooled_and_per_prompt_tau_on_a_hand_made_sequence():
    # Three prompts: acceptance lengths of each verification step (accepted drafts + 1).
    per_prompt = [[1, 1, 4], [6], [2, 2, 2, 2]]
    summary = tau_summary(per_prompt, block_size=8)
    # Pooled: all accepted tokens over all steps = 20 / 8.
    assert summary["tau_pooled"] == 2.5
    # Per prompt, then the mean (the benchmark's "Average Acceptance length"): (2 + 6 + 2) / 3.
    assert summary["tau_per_prompt"] == [2.0, 6.0, 2.0]
    assert summary["tau"] == pytest.approx(10 / 3)
    assert summary["tokens"] == 20 and summary["verify_steps"] == 8 and summary["samples"] == 3
    assert summary["acceptance_length_counts"] == [0, 2, 4, 0, 1, 0, 1, 0, 0]


@pytest.fixture(scope="module")
def drafter(tiny_target):
    cfg = DrafterConfig.from_target(tiny_target.config, 1, 5, 8, tiny_target.mask_token_id)
    embed, lm_head = tiny_target.embed_weight(), tiny_target.lm_head_weight()
    return build_drafter(cfg, embed, lm_head, tiny_target.device, seed=0)


def test_the_last_verification_step_runs_when_generated_equals_max_new_tokens(tiny_target, drafter):
    prompts = random_prompts(tiny_target, 2, 8, seed=0, split="heldout").tolist()
    for prompt in prompts:
        for max_new in (1, 6):
            decoded = speculative_decode(tiny_target, drafter, prompt, max_new)
            done = sum(decoded.lengths)  # tokens after the prefill's own token
            # Verified while fewer than max_new followed the prefill's token, so at least
            # max_new do now, and the last step started inside max_new.
            assert done - decoded.lengths[-1] < max_new <= done, (max_new, decoded.lengths)
            assert len(decoded.tokens) == 1 + done


def test_a_sample_stops_after_the_step_that_made_a_stop_token(tiny_target, drafter):
    prompt = random_prompts(tiny_target, 1, 8, seed=1, split="heldout").tolist()[0]
    free = speculative_decode(tiny_target, drafter, prompt, 16)
    # A token first made a few steps in (not the prefill's: that one waits for a first step).
    first = next(i for i, t in enumerate(free.tokens) if i >= 4 and free.tokens.index(t) == i)
    stop = free.tokens[first]
    stopped = speculative_decode(tiny_target, drafter, prompt, 16, frozenset({stop}))
    # The same greedy tokens up to the step that produced the stop token, then no more steps.
    assert stopped.tokens == free.tokens[: len(stopped.tokens)]
    assert stop in stopped.tokens
    assert len(stopped.tokens) - stopped.lengths[-1] <= first < len(stopped.tokens)
    assert len(stopped.lengths) < len(free.lengths)


def test_stop_token_flag():
    assert stop_token_list("2,151645") == frozenset({2, 151645})
    assert stop_token_list("none") == frozenset()
    with pytest.raises(Exception, match="not a list of token ids"):
        stop_token_list("eos")
