"""Training data at the size of a real run: prepare speed, start to first step, memory per process.

    .venv/bin/python bench/data.py [--sizes 40M 400M 2B] [--runs 3] [--jsonl-up-to 400M]
                                   [--baseline] [--dir /var/tmp/dflash-bench-data]

Makes its own synthetic set: samples of 200 to 3072 tokens (mean ~1640, about what 1.1 M
prompts with regenerated responses come to at 2 B tokens), ids within Qwen3's vocabulary
(151936), a prompt with loss mask 0 and a response with 1. For each size:

- prepare: `python -m dflash.data prepare` of the JSONL, tokens/s (sizes above --jsonl-up-to
  are written as binary arrays directly: JSONL of that size costs more machine time than the
  figure is worth; the table says so);
- start: `python -m dflash.train --data STORE` with a small random target of Qwen3's
  vocabulary, seconds from process start to its `data:` line and to its first step;
- memory: a process that opens the store and takes 50 batches, alone and 4 at once: RSS, PSS
  and private (anonymous) memory from /proc/PID/smaps_rollup.

With --baseline the loader this store replaced (dflash/data/ `load_jsonl` at 28a5e8c, from
git) reads the smallest JSONL in the same run: its seconds and resident memory.
Medians of --runs runs. Needs free disk of about 6x the largest size in bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from dflash.data.store_writer import StoreWriter  # noqa: E402

VOCAB = 151936
SHORTEST, LONGEST = 200, 3072
MEMORY_BATCHES = 50
OLD_LOADER = "28a5e8c"

HOLD = """
import sys, time
from pathlib import Path
from dflash.data.order import BatchOrder
from dflash.data.store import TokenStore
order = BatchOrder(TokenStore.open(Path(sys.argv[1])), 3072, 3072, 1, seed=0, max_len=3072)
for _ in range(int(sys.argv[2])):
    order.next()
print("ready", flush=True)
sys.stdin.read()
"""


def parse_size(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMB]?)", text).groups()  # type: ignore[union-attr]
    return int(number) * {"": 1, "K": 10**3, "M": 10**6, "B": 10**9}[unit]


def sample_chunks(tokens: int, seed: int = 0, chunk: int = 20_000):
    """(ids, mask, lengths) chunks of synthetic samples until `tokens` tokens."""
    rng = np.random.default_rng(seed)
    made = 0
    while made < tokens:
        lengths = rng.integers(SHORTEST, LONGEST + 1, chunk).astype(np.int64)
        ends = np.cumsum(lengths)
        lengths = lengths[: max(1, int(np.searchsorted(ends, tokens - made)) + 1)]
        total = int(lengths.sum())
        ids = rng.integers(0, VOCAB, total, dtype=np.int32)
        prompts = (lengths * rng.uniform(0.1, 0.5, len(lengths))).astype(np.int64)
        starts = np.cumsum(lengths) - lengths
        position = np.arange(total) - np.repeat(starts, lengths)
        mask = (position >= np.repeat(prompts, lengths)).astype(np.uint8)
        yield ids, mask, lengths
        made += total


def write_jsonl(path: Path, tokens: int) -> None:
    words = np.array([str(i) for i in range(VOCAB)], dtype=object)
    with path.open("w") as out:
        for ids, mask, lengths in sample_chunks(tokens):
            starts = np.cumsum(lengths) - lengths
            lines = []
            for start, n in zip(starts.tolist(), lengths.tolist(), strict=True):
                prompt = int(n - mask[start : start + n].sum())
                lines.append(
                    '{"input_ids": [' + ", ".join(words[ids[start : start + n]]) + "], "
                    '"loss_mask": [' + ", ".join(["0"] * prompt + ["1"] * (n - prompt)) + "]}\n"
                )
            out.write("".join(lines))


def write_binary(out: Path, tokens: int) -> None:
    with StoreWriter(out, force=True, say=lambda _: None) as writer:
        for ids, mask, lengths in sample_chunks(tokens):
            writer.add(ids, mask, lengths)
        writer.finish(
            sources=[{"name": "synthetic (binary, bench/data.py)"}],
            settings={"max_seq_len": LONGEST, "vocab_size": VOCAB},
        )


def prepare_seconds(jsonl: Path, out: Path) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "dflash.data", "prepare", "--force", "--vocab-size", str(VOCAB),
         "--out", str(out), str(jsonl)],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    return time.monotonic() - started


def small_target(folder: Path) -> Path:
    """A 2-layer Qwen3 config with Qwen3's vocabulary (random weights, built by the trainer)."""
    folder.mkdir(parents=True, exist_ok=True)
    from transformers import Qwen3Config

    Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=True,
    ).save_pretrained(folder)  # fmt: skip
    return folder


def start_seconds(store: Path, target: Path, work: Path) -> tuple[float, float]:
    """Seconds from process start to the trainer's `data:` line and to its first step."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [
        sys.executable, "-m", "dflash.train", "--target-model", str(target),
        "--target-random-init", "--mask-token-id", str(VOCAB - 1), "--num-target-layers", "2",
        "--drafter-layers", "1", "--max-seq-len", str(LONGEST), "--token-budget", str(LONGEST),
        "--num-anchors", "8", "--data", str(store), "--max-steps", "1", "--log-every", "1",
        "--checkpoint-dir", str(work / "ck"), "--status-file", str(work / "status.json"),
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    data_at = step_at = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if data_at is None and " data: " in line:
            data_at = time.monotonic() - started
        if step_at is None and re.search(r" step 1 loss ", line):
            step_at = time.monotonic() - started
    if proc.wait() != 0 or data_at is None or step_at is None:
        raise RuntimeError(f"the trainer failed on {store} (rc {proc.returncode})")
    return data_at, step_at


def smaps(pid: int) -> dict[str, int]:
    """Rss, Pss and Anonymous of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"], "anon": fields["Anonymous"]}


def memory(store: Path, processes: int) -> dict[str, int]:
    """Summed over `processes` that each opened the store and took their batches."""
    command = [sys.executable, "-c", HOLD, str(store), str(MEMORY_BATCHES)]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(command, cwd=REPO, **pipes) for _ in range(processes)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        totals = {"rss": 0, "pss": 0, "anon": 0}
        for proc in procs:
            for key, value in smaps(proc.pid).items():
                totals[key] += value
        return totals
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


OLD = """
import importlib.util, resource, sys, time
started = time.monotonic()
spec = importlib.util.spec_from_file_location("old_data", sys.argv[1])
module = sys.modules["old_data"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from pathlib import Path
samples = module.load_jsonl(Path(sys.argv[2]), None, 151936, 3072)
print(time.monotonic() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def baseline(jsonl: Path, work: Path) -> tuple[float, int]:
    """The JSONL loader before the store (git show), on the same file: seconds, peak RSS."""
    old = work / "old_data.py"
    old.write_text(subprocess.run(["git", "show", f"{OLD_LOADER}:dflash/data/"], cwd=REPO,
                                  check=True, capture_output=True, text=True).stdout)  # fmt: skip
    out = subprocess.run([sys.executable, "-c", OLD, str(old), str(jsonl)], cwd=REPO,
                         check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    return float(out[0]), int(out[1])


def mb(value: float) -> str:
    return f"{value / 1e6:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["40M", "400M", "2B"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jsonl-up-to", default="400M")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/dflash-bench-data"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    target = small_target(args.dir / "target")
    jsonl_limit = parse_size(args.jsonl_up_to)
    rows = []
    for size in args.sizes:
        tokens = parse_size(size)
        store = args.dir / f"store-{size}"
        row: dict[str, object] = {"size": size}
        if tokens <= jsonl_limit:
            jsonl = args.dir / f"data-{size}.jsonl"
            if not jsonl.exists():
                write_jsonl(jsonl, tokens)
            row["jsonl_mb"] = jsonl.stat().st_size / 1e6
            runs = [prepare_seconds(jsonl, store) for _ in range(args.runs)]
            row["prepare_s"] = statistics.median(runs)
            if args.baseline and size == args.sizes[0]:
                row["baseline_s"], row["baseline_rss"] = baseline(jsonl, args.dir)
        else:
            write_binary(store, tokens)
            row["prepare_s"] = None
        manifest = json.loads((store / "manifest.json").read_text())
        row["tokens"], row["samples"] = manifest["tokens"], manifest["samples"]
        if row["prepare_s"]:
            row["prepare_tok_s"] = manifest["tokens"] / row["prepare_s"]
        starts = [start_seconds(store, target, args.dir / "run") for _ in range(args.runs)]
        row["data_s"] = statistics.median(s[0] for s in starts)
        row["first_step_s"] = statistics.median(s[1] for s in starts)
        row["one"] = memory(store, 1)
        row["four"] = memory(store, 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(f"medians of {args.runs}; memory after {MEMORY_BATCHES} batches, MB")
    print(
        "| tokens | samples | prepare s | prepare M tok/s | start->data s | start->step 1 s "
        "| 1 proc RSS / PSS / private | 4 procs RSS / PSS / private (sums) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        one, four = r["one"], r["four"]
        prep = (f"{r['prepare_s']:.1f}", f"{r['prepare_tok_s'] / 1e6:.2f}") if r["prepare_s"] \
            else ("binary", "-")  # fmt: skip
        print(
            f"| {r['tokens'] / 1e6:,.0f} M | {r['samples']:,} | {prep[0]} | {prep[1]} | "
            f"{r['data_s']:.1f} | {r['first_step_s']:.1f} | "
            f"{mb(one['rss'])} / {mb(one['pss'])} / {mb(one['anon'])} | "
            f"{mb(four['rss'])} / {mb(four['pss'])} / {mb(four['anon'])} |"
        )
    for r in rows:
        if "baseline_s" in r:
            print(
                f"baseline ({OLD_LOADER} load_jsonl) on the {r['size']} JSONL: "
                f"{r['baseline_s']:.1f} s, peak RSS {mb(r['baseline_rss'])} MB; prepare "
                f"{r['prepare_s']:.1f} s (x{r['baseline_s'] / r['prepare_s']:.1f} faster)"
            )


if __name__ == "__main__":
    main()
