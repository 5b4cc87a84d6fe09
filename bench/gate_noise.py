"""How far the health gate's figure moves on a shared CPU with nothing changed: the tiny CPU
trainer's tokens/s at the health check (the trainer's window after N steps), run after run, on
a quiet machine and beside CPU-burning processes, in the same run of this script.

    .venv/bin/python bench/gate_noise.py [--runs 7] [--steps 5] [--burners 2]

Prints, per condition, the median, the range and the lowest run as a share of the quiet
median: the share a throughput gate must stay under to pass unchanged code on such a host
(docs/deploy.md "The throughput gate"), for the figure as measured (`tokens_per_s`) and with
the trainer's wait for a CPU left out (`unstarved_tokens_per_s`, what the gate compares).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BURN = "while True: pass"


def health_check_figure(steps: int, folder: Path) -> tuple[float, float]:
    """tokens/s as the launch's health check reads it, status.json after `steps` steps: as
    measured and unstarved."""
    status = folder / "status.json"
    subprocess.run(
        [sys.executable, "-m", "dflash.train", "--target-model", "tiny", "--gen-samples", "32",
         "--max-steps", str(steps), "--checkpoint-dir", str(folder / "ck"),
         "--checkpoint-every", "100000", "--status-file", str(status), "--run-id", "noise"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    written = json.loads(status.read_text())
    return float(written["tokens_per_s"]), float(written["unstarved_tokens_per_s"])


def measure(runs: int, steps: int, burners: int) -> list[tuple[float, float]]:
    procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(burners)]
    try:
        figures = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                figures.append(health_check_figure(steps, Path(tmp)))
        return figures
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--burners", type=int, default=2)
    args = parser.parse_args()
    quiet = measure(args.runs, args.steps, 0)
    loaded = measure(args.runs, args.steps, args.burners)
    print(f"tiny CPU trainer, tokens/s after {args.steps} steps, {args.runs} runs each")
    print(f"{'figure':<10} {'condition':<16} {'median':>8} {'min':>8} {'max':>8} "
          f"{'min/quiet median':>17}")  # fmt: skip
    for which, index in (("measured", 0), ("unstarved", 1)):
        base = statistics.median(run[index] for run in quiet)
        for name, runs in (("quiet", quiet), (f"{args.burners} CPU burners", loaded)):
            figures = [run[index] for run in runs]
            print(
                f"{which:<10} {name:<16} {statistics.median(figures):>8.0f} "
                f"{min(figures):>8.0f} {max(figures):>8.0f} {min(figures) / base:>17.2f}"
            )


if __name__ == "__main__":
    main()
