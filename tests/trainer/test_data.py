"""JSONL data (ids, text, prompt + response), self-generated data and the batch order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash.data import BatchOrder, Sample, load_jsonl, self_generated
from dflash.errors import ConfigError


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def word_tokenizer(tmp_path: Path) -> str:
    """A local word-level tokenizer folder (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "the", "cat", "sat", "on", "a", "mat"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(folder)
    return str(folder)


def test_jsonl_forms(tmp_path, word_tokenizer):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"input_ids": [5, 6, 7, 8], "loss_mask": [0, 1, 1, 0]},
            {"input_ids": [1, 2, 3]},
            {"text": "the cat sat"},
            {"prompt": "the cat", "response": "sat on a mat"},
            {"input_ids": [1, 2], "loss_mask": [1, 0]},  # no anchor: dropped
        ],
    )
    samples = load_jsonl(path, word_tokenizer, vocab_size=10, max_len=5)
    assert samples == [
        Sample([5, 6, 7, 8], [0, 1, 1, 0]),
        Sample([1, 2, 3], [1, 1, 1]),
        Sample([1, 2, 3], [1, 1, 1]),
        Sample([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]),  # cut to max_len
    ]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ("not json", "line 1: not JSON"),
        ({"input_ids": [1, 2], "loss_mask": [1]}, "integer lists of one length"),
        ({"input_ids": [1, 99]}, "outside the target's 0..9"),
        ({"text": "hi"}, "text needs a tokenizer"),
        ({"other": 1}, "needs input_ids, text, or prompt and response"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text((record if isinstance(record, str) else json.dumps(record)) + "\n")
    with pytest.raises(ConfigError, match=f"--data '{path}'.*{message}"):
        load_jsonl(path, None, vocab_size=10, max_len=100)


def test_self_generated_samples_are_the_targets_greedy_continuations(tiny_target):
    samples = self_generated(tiny_target, 3, 4, 6, seed=0, split="train", max_len=100)
    heldout = self_generated(tiny_target, 3, 4, 6, seed=0, split="heldout", max_len=100)
    assert samples == self_generated(tiny_target, 3, 4, 6, seed=0, split="train", max_len=100)
    assert samples != heldout
    for sample in samples:
        assert sample.loss_mask == [0] * 4 + [1] * 6
        assert tiny_target.mask_token_id not in sample.input_ids[:4]
        _, logits = tiny_target.forward(torch.tensor([sample.input_ids]), logits=True)
        greedy = logits[0, 3:-1].argmax(-1).tolist()
        assert greedy == sample.input_ids[4:]


def test_batch_order_is_reproducible_resumable_and_within_budget():
    samples = [Sample(list(range(n)), [1] * n) for n in range(3, 40)]
    order = BatchOrder(samples, token_budget=64, pad_to=8, fixed_rows=None, seed=3)
    first = [order.next() for _ in range(5)]
    assert all(b.input_ids.numel() <= 64 or b.input_ids.shape[0] == 1 for b in first)
    assert all(b.input_ids.shape[1] % 8 == 0 for b in first)
    state = order.state_dict()
    later = [order.next().input_ids for _ in range(30)]  # crosses into the next epoch

    resumed = BatchOrder(samples, token_budget=64, pad_to=8, fixed_rows=None, seed=3)
    assert resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next().input_ids, ids) for ids in later)
    assert not resumed.load_state_dict({**state, "num_samples": 5})

    fixed = BatchOrder(samples, token_budget=64, pad_to=40, fixed_rows=2, seed=3)
    assert {tuple(fixed.next().input_ids.shape) for _ in range(40)} == {(2, 40)}
