"""Cold and no-op deploy of the working tree to the local target: medians over N runs, and
their ratio to a one-module baseline playbook measured in the same run.

    .venv/bin/python bench/deploy_local.py [--runs 5]

Cold = a fresh state root whose torch env is hard-linked from one built at the start (the env
build, ~40 s, is timed once on its own); the trainer is not launched (dflash_launch=false), so
what is timed is preflight, build, push, unpack, env check, cache, switch, run.sh and record.

With --launch, also a launched redeploy of the same release that restarts its trainer
(dflash_restart=true; the tiny trainer idling 0.5 s a step, as the tests run it): the stop,
the start, the health check's 5 steps and the wait on them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from leftovers import stopped_at_exit  # noqa: E402

from tests.helpers import playbook_command, playbook_env  # noqa: E402


def timed(playbook: str, extravars: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        playbook_command(playbook, extravars),
        cwd=REPO,
        env=playbook_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{playbook} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return elapsed


def launched_restarts(root: Path, runs: int) -> list[float]:
    """A launched deploy, then `runs` redeploys that restart its trainer; stopped after."""
    extravars = {
        "dflash_root": str(root), "dflash_launch": True,
        "dflash_trainer_args": {"target_model": "tiny", "gen_samples": 16, "drafter_layers": 2,
                                "token_budget": 128, "sleep_per_step": 0.5},
    }  # fmt: skip
    stop = lambda: timed("playbooks/stop.yml", {"dflash_root": str(root)})  # noqa: E731
    with stopped_at_exit({root: stop}):
        timed("deploy.yml", extravars)
        seconds = [timed("deploy.yml", {**extravars, "dflash_restart": True}) for _ in range(runs)]
        stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--launch", action="store_true", help="also time a launched restart")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {
        "baseline (1 module)": [],
        "cold deploy": [],
        "no-op deploy": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        seed = Path(tmp) / "seed" / "dflash"
        seed.parent.mkdir()
        timed("playbooks/wheelhouse.yml", {})
        env_build = timed("deploy.yml", {"dflash_root": str(seed), "dflash_launch": False})
        for run in range(args.runs):
            root = Path(tmp) / f"run{run}" / "dflash"
            root.mkdir(parents=True)
            subprocess.run(["cp", "-al", str(seed / "envs"), str(root / "envs")], check=True)
            extravars = {"dflash_root": str(root), "dflash_launch": False}
            rows["baseline (1 module)"].append(timed("bench/baseline.yml", extravars))
            rows["cold deploy"].append(timed("deploy.yml", extravars))
            rows["no-op deploy"].append(timed("deploy.yml", extravars))
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
        if args.launch:
            rows["launched restart"] = launched_restarts(Path(tmp) / "run0" / "dflash", args.runs)
    print(f"first deploy with the env build: {env_build:.1f} s (once)")
    base = statistics.median(rows["baseline (1 module)"])
    print(f"{'what':<22} {'median s':>9} {'min s':>7} {'max s':>7} {'x baseline':>11}")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:<22} {med:>9.2f} {min(values):>7.2f} {max(values):>7.2f} {med / base:>11.2f}")


if __name__ == "__main__":
    main()
