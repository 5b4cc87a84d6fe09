"""End-to-end trainer benchmark: a random Qwen3-8B-shaped target feeding a Qwen3-8B-shaped
drafter through `torchrun ... -m dflash.train`, colocated on one GPU and split over two.

    python bench/trainer/pipeline.py [--out DIR] [--steps 20] [--runs NAME,...]

The target is built from a Qwen3-8B config.json with random weights (`--target-random-init`:
36 layers, hidden 4096, no download); the data are random token sequences of 3072 tokens, all
in the loss, so every step is one row of 3072 with 512 anchors and blocks of 16. Runs, each a
fresh process group killed once it has done --steps steps (no final 12 GB checkpoint):

    colocated-cold   GPU 0 runs target and drafter, --compile-drafter, empty compile cache
    split-warm       target on GPU 0, drafter on GPU 1, --compile-drafter, the cache it filled
    colocated-warm   GPU 0, --compile-drafter, the same cache
    colocated-eager  GPU 0, drafter not compiled
    split-eager      target on GPU 0, drafter on GPU 1, drafter not compiled

A run's name with `+target` (e.g. `colocated-warm+target`) adds --compile-target: the target's
decoder layers compiled too.

Per run: seconds from process start to the first step; the steady step time (median step_s of
the log from step 3 on); tokens/s and the per-stage seconds of status.json; drafter MFU =
drafter FLOPs / (drafter forward + backward + optimizer seconds) / peak; end-to-end MFU =
drafter FLOPs / step seconds / peak; the slowest stage (target: forward + transfer; drafter:
forward + backward + optimizer) against the step. FLOPs are counted by `drafter_step.py`'s
`model_flops` (drafter) and `target_flops` below: 2 per multiply-add of every matmul, causal
attention counted on the half it computes, backward twice the forward for trained weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # dflash from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from drafter_step import model_flops

from dflash.model import DrafterConfig
from dflash.objective import sample_anchors

REPO = Path(__file__).resolve().parents[2]
SEQ, ANCHORS, BLOCK, DRAFTER_LAYERS, FEATURES = 3072, 512, 16, 5, 5
# name: (target GPUs, drafter GPUs, --compile-drafter, seconds allowed). One compile cache for
# all, filled by the first run: "cold" must come first. Eager still compiles flex_attention
# (cache hits after the cold run).
RUNS = {
    "colocated-cold": ("0", "0", True, 300.0),
    "split-warm": ("0", "1", True, 150.0),
    "colocated-warm": ("0", "0", True, 150.0),
    "colocated-eager": ("0", "0", False, 200.0),
    "split-eager": ("0", "1", False, 200.0),
}


def qwen3_8b_config() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        tie_word_embeddings=False,
    )


def target_flops(config: Any, tokens: int, seq_len: int) -> float:
    """The target's forward through all its layers (the lm_head is not run)."""
    h, d = config.hidden_size, config.head_dim
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    per_token = 2 * (h * heads * d * 2 + h * kv * d * 2 + 3 * h * config.intermediate_size)
    rows = tokens // seq_len
    attention = 2 * 2 * rows * (seq_len * (seq_len + 1) / 2) * heads * d  # QK^T and PV
    return config.num_hidden_layers * (per_token * tokens + attention)


def prepare(work: Path, samples: int) -> tuple[Path, Path, Any]:
    """The target folder (config.json only) and random-token data."""
    config = qwen3_8b_config()
    target = work / "qwen3-8b-random"
    config.save_pretrained(target)
    data = work / "data.jsonl"
    generator = torch.Generator().manual_seed(0)
    with data.open("w") as out:
        for _ in range(samples):
            ids = torch.randint(0, config.vocab_size - 1, (SEQ,), generator=generator)
            out.write(json.dumps({"input_ids": ids.tolist()}) + "\n")
    return target, data, config


def train_command(target: Path, data: Path, gpus: tuple[str, str], compile_: bool) -> list[str]:
    nproc = len(set(gpus[0].split(",")) | set(gpus[1].split(",")))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(nproc), "-m", "dflash.train"]
    command += ["--target-gpus", gpus[0], "--drafter-gpus", gpus[1]]
    command += ["--target-model", str(target), "--target-random-init"]
    command += ["--mask-token-id", "151935", "--data", str(data)]
    command += ["--max-seq-len", str(SEQ), "--num-anchors", str(ANCHORS)]
    command += ["--drafter-layers", str(DRAFTER_LAYERS), "--block-size", str(BLOCK)]
    command += ["--log-every", "1", "--checkpoint-every", "1000000", "--status-interval", "0.5"]
    return [*command, "--compile-drafter"] if compile_ else command


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its workers in sessions of their own)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [p for child in children for p in (child, *descendants(child))]


def stop(process: subprocess.Popen[bytes], hung: bool) -> None:
    """Kill a run and all its processes; a hung one first gets SIGABRT in its workers, which
    then print their Python stacks into the log (PYTHONFAULTHANDLER)."""
    if hung:
        for worker in descendants(process.pid):
            os.kill(worker, signal.SIGABRT)
        time.sleep(5)
    for pid in [*descendants(process.pid), process.pid]:
        with contextlib.suppress(ProcessLookupError):  # gone meanwhile
            os.kill(pid, signal.SIGKILL)


def run_once(name: str, command: list[str], cache: Path, out: Path, steps: int, limit: float):
    """Start, time the first step, wait for `steps` steps, kill; returns the measurements."""
    folder = out / name
    folder.mkdir(parents=True)
    status_path = folder / "status.json"
    command = [*command, "--checkpoint-dir", str(folder / "ck"), "--status-file", str(status_path)]
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(cache),
        TRITON_CACHE_DIR=str(cache / "triton"),
        PYTHONFAULTHANDLER="1",
    )
    log_path = out / f"{name}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        first_step_s = None
        status: dict[str, Any] | None = None
        try:
            while time.monotonic() - start < limit and process.poll() is None:
                status = read_json(status_path) or status
                step = status["step"] if status else 0
                if first_step_s is None and step >= 1:
                    first_step_s = time.monotonic() - start
                if step >= steps:
                    break
                time.sleep(0.1)
        finally:
            stop(process, hung=not status or status["step"] < steps)
            process.wait()
    step_s = [
        float(words[words.index("step_s") + 1])
        for words in (line.split() for line in log_path.read_text().splitlines())
        if len(words) > 2 and words[1] == "step" and int(words[2]) >= 3 and "step_s" in words
    ]
    return {
        "run": name,
        "command": " ".join(command),
        "first_step_s": first_step_s,
        "steps": status["step"] if status else 0,
        "step_s": statistics.median(step_s) if step_s else None,
        "tokens_per_s": status["tokens_per_s"] if status else None,
        "stages": status["stages"] if status else None,
        "state": status["state"] if status else None,
    }


def analyse(result: dict[str, Any], drafter_flops: float, target_fwd: float, peak: float):
    stages, step_s = result["stages"], result["step_s"]
    if not stages or not step_s:
        return
    drafter = stages["drafter_forward"] + stages["drafter_backward"] + stages["optimizer"]
    target = (stages["target_forward"] or 0.0) + (stages["transfer"] or 0.0)
    result["drafter_busy_s"] = round(drafter, 4)
    result["target_busy_s"] = round(target, 4)
    result["drafter_mfu"] = round(drafter_flops / drafter / peak, 3)
    result["end_to_end_mfu"] = round(drafter_flops / step_s / peak, 3)
    if stages["target_forward"]:
        result["target_mfu"] = round(target_fwd / stages["target_forward"] / peak, 3)
    # Split: the stages overlap, the slowest one bounds the step; colocated they add up.
    split = stages["transfer"] is not None
    slowest = max(drafter, target) if split else drafter + target
    result["slowest_stage_s"] = round(slowest, 4)
    result["step_over_slowest"] = round(step_s / slowest, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / "dflash-bench-pipeline"
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds for all runs")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200)")
    args = parser.parse_args()
    runs = args.runs.split(",")
    for name in runs:
        kind, plus, extra = name.partition("+")
        if kind not in RUNS or (plus and extra != "target"):
            sys.exit(f"--runs: '{name}' is not one of {', '.join(RUNS)} (each may end in +target)")
    out = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        sys.exit(f"--out {out}: not empty (its compile cache would make the cold run warm)")
    out.mkdir(parents=True, exist_ok=True)
    target, data, config = prepare(out, args.samples)

    cfg = DrafterConfig.from_target(config, DRAFTER_LAYERS, FEATURES, BLOCK, 151935)
    anchors, _ = sample_anchors(
        torch.ones(1, SEQ, dtype=torch.bool), ANCHORS, torch.Generator().manual_seed(0), True
    )
    drafter_flops = sum(model_flops(cfg, 1, SEQ, anchors).values())
    target_fwd = target_flops(config, SEQ, SEQ)
    peak = args.peak_tflops * 1e12
    results = []
    deadline = time.monotonic() + args.deadline
    for name in runs:
        kind, _, extra = name.partition("+")
        target_gpus, drafter_gpus, compile_, limit = RUNS[kind]
        limit = min(limit, deadline - time.monotonic())
        if limit < 30:
            print(f"{name}: skipped, the deadline is near", flush=True)
            continue
        command = train_command(target, data, (target_gpus, drafter_gpus), compile_)
        command += ["--compile-target"] if extra else []
        result = run_once(name, command, out / "cache", out, args.steps, limit)
        analyse(result, drafter_flops, target_fwd, peak)
        results.append(result)
        print(json.dumps(result), flush=True)
        summary = {"drafter_tflop": drafter_flops / 1e12, "target_tflop": target_fwd / 1e12}
        (out / "pipeline.json").write_text(json.dumps({**summary, "runs": results}, indent=2))

    tflop = f"drafter {drafter_flops / 1e12:.1f}, target {target_fwd / 1e12:.1f}"
    print(f"TFLOP per step: {tflop}")
    keys = ["first_step_s", "step_s", "tokens_per_s", "drafter_mfu", "end_to_end_mfu"]
    keys += ["target_busy_s", "drafter_busy_s", "step_over_slowest"]
    print("| run | " + " | ".join(keys) + " |")
    for result in results:
        print(f"| {result['run']} | " + " | ".join(str(result.get(k)) for k in keys) + " |")
    for result in results:
        print(result["run"], json.dumps(result["stages"]))


if __name__ == "__main__":
    main()
