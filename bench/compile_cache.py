"""Time to the first training step with a cold and with a warm compile cache (compile on).

    python bench/compile_cache.py [--runs 5] [--gpu]   (from the repository root)

Each run starts `python -m dflash.train --compile-drafter --max-steps 1` as a fresh process and
times it until it exits after its first step. Cold: a new, empty TORCHINDUCTOR_CACHE_DIR /
TRITON_CACHE_DIR every run. Warm: one cache filled by `python -m dflash.warmup` beforehand (as
deploy.yml's warm step does), reused by every run. A run without compile, measured in the same
session, is the baseline: process start, model build and data generation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPE = ["--target-model", "tiny", "--drafter-layers", "2", "--max-seq-len", "128",
         "--token-budget", "256", "--num-anchors", "16"]  # fmt: skip


def first_step_seconds(cache: Path, gpu: bool, compile_drafter: bool) -> float:
    with tempfile.TemporaryDirectory() as work:
        cmd = [
            sys.executable,
            "-m",
            "dflash.train",
            *SHAPE,
            "--max-steps",
            "1",
            "--checkpoint-dir",
            f"{work}/ck",
            "--status-file",
            f"{work}/status.json",
        ]
        if compile_drafter:
            cmd.append("--compile-drafter")
        if gpu:
            cmd += ["--target-gpus", "0", "--drafter-gpus", "0"]
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=str(cache),
            TRITON_CACHE_DIR=str(cache / "triton"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gpu", action="store_true", help="GPU 0 as target and drafter")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {"no compile (baseline)": [], "cold cache": [], "warm cache": []}
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm"
        warmup = [sys.executable, "-m", "dflash.warmup", *SHAPE, "--compile-drafter"]
        if args.gpu:
            warmup += ["--drafter-gpus", "0"]
        subprocess.run(warmup, cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(warm),
                                TRITON_CACHE_DIR=str(warm / "triton")))  # fmt: skip
        for run in range(args.runs):
            rows["no compile (baseline)"].append(
                first_step_seconds(Path(tmp) / f"none{run}", args.gpu, False)
            )
            rows["cold cache"].append(first_step_seconds(Path(tmp) / f"cold{run}", args.gpu, True))
            rows["warm cache"].append(first_step_seconds(warm, args.gpu, True))
            print(f"run {run + 1}/{args.runs}", file=sys.stderr)
    base = statistics.median(rows["no compile (baseline)"])
    cold = statistics.median(rows["cold cache"])
    print(
        f"device: {'GPU' if args.gpu else 'CPU'}; seconds from process start to the end of step 1"
    )
    print(f"{'what':<24} {'median s':>9} {'min s':>7} {'max s':>7} {'- baseline s':>13}")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:<24} {med:>9.2f} {min(values):>7.2f} {max(values):>7.2f} {med - base:>13.2f}")
    warm_med = statistics.median(rows["warm cache"])
    print(
        f"compile share, cold / warm: {(cold - base) / max(warm_med - base, 1e-3):.1f}x; "
        f"whole start, cold / warm: {cold / warm_med:.2f}x"
    )


if __name__ == "__main__":
    main()
