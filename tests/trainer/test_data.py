"""Training data: JSONL records, the prepared token store, self-generated data, the batch order."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash.data import Sample, open_data, sample_store, self_generated
from dflash.data.cli import main
from dflash.data.order import BatchOrder
from dflash.data.prepare import load_in_memory, prepare
from dflash.data.records import Settings
from dflash.data.store import TokenStore
from dflash.data.store_writer import StoreWriter
from dflash.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def samples_of(store: TokenStore) -> list[Sample]:
    pairs = (store.sample(i) for i in range(store.num_samples))
    return [Sample(ids.tolist(), mask.tolist()) for ids, mask in pairs]


def random_records(count: int, seed: int, vocab: int = 100, longest: int = 60) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(count):
        n = int(rng.integers(3, longest))
        prompt = int(rng.integers(0, n - 1))
        records.append(
            {
                "input_ids": rng.integers(0, vocab, n).tolist(),
                "loss_mask": [0] * prompt + [1] * (n - prompt),
            }
        )
    return records


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


FORMS = [
    {"input_ids": [5, 6, 7, 8], "loss_mask": [0, 1, 1, 0]},
    {"input_ids": [1, 2, 3]},
    {"text": "the cat sat"},
    {"prompt": "the cat", "response": "sat on a mat"},
    {"input_ids": [1, 2], "loss_mask": [1, 0]},  # no anchor: dropped
]
FORM_SAMPLES = [
    Sample([5, 6, 7, 8], [0, 1, 1, 0]),
    Sample([1, 2, 3], [1, 1, 1]),
    Sample([1, 2, 3], [1, 1, 1]),
    Sample([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]),  # cut to max_len
]


def test_the_three_record_forms_in_memory_and_prepared(tmp_path, word_tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", FORMS)
    settings = Settings(max_seq_len=5, vocab_size=10, tokenizer=word_tokenizer)
    assert samples_of(load_in_memory(path, settings)) == FORM_SAMPLES

    made = prepare([path], tmp_path / "store", settings, say=lambda _: None)
    store = TokenStore.open(tmp_path / "store", verify=True)
    assert samples_of(store) == FORM_SAMPLES
    assert store.manifest == made
    assert made["samples"] == 4 and made["tokens"] == 15 and made["supervised_tokens"] == 11
    assert made["lengths"] == {"p50": 3, "p90": 5, "p99": 5, "max": 5}
    assert made["prepare"]["records"] == 5 and made["prepare"]["dropped"] == 1
    assert made["prepare"]["cut"] == 1
    assert made["tokenizer"]["name"] == "tokenizer" and len(made["tokenizer"]["sha256"]) == 64
    source = made["sources"][0]
    assert source["name"] == "d.jsonl" and source["size"] == path.stat().st_size
    assert source["records"] == 5 and source["samples"] == 4
    # The same content is the same data; a different token is other data.
    again = prepare([path], tmp_path / "again", settings, say=lambda _: None)
    assert again["content_sha256"] == made["content_sha256"]
    changed = {"input_ids": [5, 6, 7, 9], "loss_mask": [0, 1, 1, 0]}
    other = write_jsonl(tmp_path / "e.jsonl", [changed, *FORMS[1:]])
    assert (
        prepare([other], tmp_path / "other", settings, say=lambda _: None)["content_sha256"]
        != made["content_sha256"]
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object, found list"),
        ({"input_ids": [1, 2], "loss_mask": [1]}, "line 2: input_ids has 2 ids but loss_mask 1"),
        ({"input_ids": [1, "x"]}, "line 2: input_ids must be a list of integers"),
        ({"input_ids": [1, 2.5]}, "line 2: input_ids must be a list of integers"),
        (
            {"input_ids": [1, 99]},
            "line 2: token id 99 at position 1 is outside the vocabulary 0..9",
        ),
        ({"input_ids": [-1, 2]}, "line 2: token id -1 at position 0 is outside the vocabulary"),
        ({"text": "hi"}, "line 2: text needs a tokenizer; pass --tokenizer"),
        ({"other": 1}, "line 2: needs input_ids, text, or prompt and response"),
    ],
)
def test_each_bad_record_is_named_with_its_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"input_ids": [1, 2, 3]})
    path.write_text(f"{good}\n{line if isinstance(line, str) else json.dumps(line)}\n")
    settings = Settings(max_seq_len=100, vocab_size=10, tokenizer=None)
    with pytest.raises(ConfigError, match=f"'{path}' {message}"):
        prepare([path], tmp_path / "store", settings, say=lambda _: None)
    assert not (tmp_path / "store").exists()
    assert not list(tmp_path.glob(".store*")), "a failed prepare left its temp folder"


def test_an_empty_result_and_bad_arguments_are_refused_before_any_store(tmp_path, capsys):
    path = write_jsonl(tmp_path / "flat.jsonl", [{"input_ids": [1, 2], "loss_mask": [1, 0]}])
    assert main(["prepare", "--out", str(tmp_path / "s"), "--vocab-size", "10", str(path)]) == 2
    assert "no sample to train on (1 records, 1 without two consecutive" in capsys.readouterr().err
    assert main(["prepare", "--out", str(tmp_path / "s"), str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl': no such file" in capsys.readouterr().err
    assert main(["prepare", "--out", str(tmp_path / "no" / "s"), str(path)]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 2
    assert "no manifest.json, so not a prepared store" in capsys.readouterr().err
    assert not list(tmp_path.glob("*s*prepare*"))


def test_prepare_refuses_to_replace_a_store_unless_forced_and_inspect_prints_it(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", random_records(50, seed=1))
    out = tmp_path / "store"
    assert main(["prepare", "--out", str(out), "--vocab-size", "100", str(path)]) == 0
    assert "prepare: 100% of" in capsys.readouterr().err
    assert main(["prepare", "--out", str(out), str(path)]) == 2
    assert "exists; pass --force to replace it" in capsys.readouterr().err
    assert main(["prepare", "--out", str(out), "--force", str(path)]) == 0
    capsys.readouterr()
    assert main(["inspect", "--verify", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["samples"] == 50 and shown["path"] == str(out)
    # A truncated array is found by the cheap check, a changed one by --verify.
    tokens = out / "tokens.i32"
    data = bytearray(tokens.read_bytes())
    data[0] ^= 1
    tokens.write_bytes(bytes(data))
    assert main(["inspect", str(out)]) == 0
    capsys.readouterr()
    assert main(["inspect", "--verify", str(out)]) == 2
    assert "does not hash to its manifest's sha256" in capsys.readouterr().err
    tokens.write_bytes(bytes(data[:-4]))
    assert main(["inspect", str(out)]) == 2
    assert "(truncated or replaced)" in capsys.readouterr().err


def test_a_killed_prepare_leaves_no_store_and_the_next_one_cleans_up(tmp_path):
    """kill -9 in the middle of a prepare: nothing under the final name; the next prepare
    removes the dead one's temp folder and finishes."""
    path = tmp_path / "big.jsonl"
    with path.open("w") as handle:
        for record in random_records(20_000, seed=2, vocab=1000, longest=400):
            handle.write(json.dumps(record) + "\n")
    out = tmp_path / "store"
    command = [sys.executable, "-m", "dflash.data", "prepare", "--workers", "1",
               "--out", str(out), str(path)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    temp = []
    while time.monotonic() < deadline and not temp and proc.poll() is None:
        temp = [p for p in tmp_path.glob(".store.prepare-*") if (p / "tokens.i32").exists()]
        time.sleep(0.01)
    assert temp, f"prepare never started writing (rc {proc.poll()})"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    assert temp[0].exists()
    made = prepare([path], out, Settings(3072, None, None), say=lambda _: None)
    assert not temp[0].exists()
    assert made["samples"] == TokenStore.open(out).num_samples > 19_000


def test_a_prepare_on_another_host_of_a_shared_folder_is_left_alone(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", random_records(5, seed=6))
    other = tmp_path / ".store.prepare-another-host-1"
    dead = tmp_path / f".store.prepare-{socket.gethostname()}-999999999"
    other.mkdir()
    dead.mkdir()
    said: list[str] = []
    prepare([path], tmp_path / "store", Settings(64, 100, None), say=said.append)
    assert other.is_dir() and not dead.exists()
    assert f"prepare: removed {dead}, left by a prepare that did not finish" in said


def test_a_parallel_prepare_writes_the_same_store_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setattr("dflash.data.prepare.IN_PROCESS_BELOW", 0)
    monkeypatch.setattr("dflash.data.prepare.CHUNK_BYTES", 4096)
    path = write_jsonl(tmp_path / "d.jsonl", random_records(400, seed=3))
    settings = Settings(max_seq_len=40, vocab_size=100, tokenizer=None)
    one = prepare([path], tmp_path / "one", settings, workers=1, say=lambda _: None)
    two = prepare([path], tmp_path / "two", settings, workers=2, say=lambda _: None)
    assert one["content_sha256"] == two["content_sha256"]
    assert one["arrays"] == two["arrays"]


def reference_batches(
    samples: list[Sample], budget: int, pad_to: int, fixed_rows: int | None, seed: int, count: int
) -> list[tuple[torch.Tensor, int]]:
    """The batch order as the trainer built it from a list of samples before the token store
    (dflash/data/ at 28a5e8c): the order a seed gives must not change."""

    def padded(n: int) -> int:
        return -(-n // pad_to) * pad_to

    def cut(epoch: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        batches, current, longest = [], [], 0
        for i in torch.randperm(len(samples), generator=generator).tolist():
            length = padded(len(samples[i].input_ids))
            full = (
                len(current) == fixed_rows
                if fixed_rows
                else (len(current) + 1) * max(longest, length) > budget
            )
            if current and full:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, length)
        batches.append(current)
        return batches

    out, epoch = [], 0
    while len(out) < count:
        for batch in cut(epoch):
            picked = [samples[i] for i in batch]
            rows = fixed_rows or len(picked)
            ids = torch.zeros(rows, padded(max(len(s.input_ids) for s in picked)), dtype=torch.long)
            for row, s in enumerate(picked):
                ids[row, : len(s.input_ids)] = torch.tensor(s.input_ids)
            out.append((ids, sum(len(s.input_ids) for s in picked)))
        epoch += 1
    return out[:count]


@pytest.mark.parametrize(("budget", "pad_to", "rows"), [(64, 8, None), (120, 40, 3)])
def test_a_prepared_store_gives_the_batches_a_seed_gave_before(tmp_path, budget, pad_to, rows):
    path = write_jsonl(tmp_path / "d.jsonl", random_records(60, seed=4, longest=40))
    settings = Settings(max_seq_len=40, vocab_size=100, tokenizer=None)
    prepare([path], tmp_path / "store", settings, say=lambda _: None)
    store = TokenStore.open(tmp_path / "store")
    expected = reference_batches(samples_of(store), budget, pad_to, rows, seed=7, count=80)
    order = BatchOrder(store, budget, pad_to, rows, seed=7, max_len=40)
    for want, tokens in expected:  # 80 batches cross several epochs
        got = order.next()
        assert torch.equal(got.input_ids, want)
        assert got.num_tokens == tokens
        assert got.loss_mask.shape == want.shape


def test_batch_order_is_resumable_on_the_same_data_only():
    samples = [Sample(list(range(n)), [1] * n) for n in range(3, 40)]
    order = BatchOrder(sample_store(samples), token_budget=64, pad_to=8, fixed_rows=None, seed=3)
    first = [order.next() for _ in range(5)]
    assert all(b.input_ids.numel() <= 64 or b.input_ids.shape[0] == 1 for b in first)
    assert all(b.input_ids.shape[1] % 8 == 0 for b in first)
    state = order.state_dict()
    assert state["data_sha256"] == order.data.manifest["content_sha256"]
    later = [order.next().input_ids for _ in range(30)]  # crosses into the next epoch

    resumed = BatchOrder(sample_store(samples), token_budget=64, pad_to=8, fixed_rows=None, seed=3)
    assert resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next().input_ids, ids) for ids in later)
    # Other data with as many samples: a new order, not the old position on new samples.
    changed = [Sample(list(range(1, n + 1)), [1] * n) for n in range(3, 40)]
    other = BatchOrder(sample_store(changed), token_budget=64, pad_to=8, fixed_rows=None, seed=3)
    assert other.num_samples == order.num_samples
    assert not other.load_state_dict(state)
    assert other.state_dict()["position"] == 0
    # A checkpoint from before the store (no data hash) starts a new order too.
    old = {"epoch": 1, "index": 2, "num_samples": len(samples)}
    assert not resumed.load_state_dict(old)

    fixed = BatchOrder(sample_store(samples), token_budget=64, pad_to=40, fixed_rows=2, seed=3)
    assert {tuple(fixed.next().input_ids.shape) for _ in range(40)} == {(2, 40)}


def test_max_len_cuts_samples_and_leaves_out_those_without_an_anchor_before_it():
    samples = [Sample([1] * 10, [0] * 8 + [1] * 2), Sample([2] * 6, [1] * 6)]
    order = BatchOrder(sample_store(samples), 100, 1, None, seed=0, max_len=5)
    assert order.num_samples == 1
    batch = order.next()
    assert batch.input_ids.tolist() == [[2] * 5] and batch.num_tokens == 5


def test_a_jsonl_file_is_prepared_once_into_the_cache_then_mapped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", random_records(30, seed=5))
    said: list[str] = []
    cache = tmp_path / "cache"
    first = open_data(str(path), None, 100, 64, said.append, cache_dir=cache)
    assert any("prepared once into" in line for line in said)
    said.clear()
    second = open_data(str(path), None, 100, 64, said.append, cache_dir=cache)
    assert any("its prepared copy" in line and "is read" in line for line in said)
    assert first.manifest["content_sha256"] == second.manifest["content_sha256"]
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [second.path.name]
    with pytest.raises(ConfigError, match=r"token id 9[0-9] is outside the target's vocabulary"):
        open_data(str(second.path), None, 90, 64, said.append)
    write_jsonl(path, random_records(31, seed=5))  # new content: a new prepared copy
    third = open_data(str(path), None, 100, 64, said.append, cache_dir=cache)
    assert third.path != second.path
    with pytest.raises(ConfigError, match="no such file or folder"):
        open_data(str(tmp_path / "none.jsonl"), None, 100, 64, said.append, cache_dir=cache)


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


MEASURE = """
import resource, sys, time
from pathlib import Path
from dflash.data.order import BatchOrder
from dflash.data.store import TokenStore
order = BatchOrder(TokenStore.open(Path(sys.argv[1])), 4096, 8, None, seed=0, max_len=4096)
for _ in range(20):
    order.next()
with open("/proc/self/status") as status:
    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
print(rss * 1024)
"""


def synthetic_store(out: Path, samples: int, length: int) -> None:
    rng = np.random.default_rng(0)
    with StoreWriter(out, say=lambda _: None) as writer:
        for start in range(0, samples, 4096):
            n = min(4096, samples - start)
            lengths = np.full(n, length, dtype=np.int64)
            tokens = rng.integers(0, 1000, n * length, dtype=np.int32)
            writer.add(tokens, np.ones(n * length, np.uint8), lengths)
        writer.finish(settings={"max_seq_len": length, "vocab_size": 1000})


@pytest.mark.slow
def test_memory_per_process_does_not_grow_with_the_data(tmp_path):
    """A process that maps a store 16x larger holds about as much memory after its first batches
    (the stores are ~20 MB and ~320 MB; a loader that read it would hold the difference)."""
    synthetic_store(tmp_path / "small", 4_000, 1000)
    synthetic_store(tmp_path / "large", 64_000, 1000)
    rss = {}
    for name in ("small", "large"):
        out = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / name)], cwd=REPO,
                             capture_output=True, text=True, check=True)  # fmt: skip
        rss[name] = int(out.stdout.split()[-1])
    size = sum(f.stat().st_size for f in (tmp_path / "large").iterdir())
    assert size > 300e6
    # Per-sample arrays (offsets, anchors, the order: ~30 bytes a sample) may grow: ~2 MB here.
    assert rss["large"] - rss["small"] < 0.05 * size, rss
