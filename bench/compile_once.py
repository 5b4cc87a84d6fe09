"""Compile once, measured through the toolkit (issue 30): the first step of a trainer after
(a) a cold deploy that compiles (dflash_compile_cache=warm: one warmup, the cache kept on the
controller), (b) a new release that changes a file outside the compiled code (dflash/export.py),
(c) a release that changes the model (dflash/model.py: a new cache folder,
compiled cold), (d) a second host of the same build given the first host's cache, and (w) a
restart of that host on its warm cache (the reference). Each row: the playbook's seconds, the
trainer's first step from its start, and status.json's compile_cache (warm start, hits, misses,
canary), and what the deploy's history line says it did with the cache.

    python3 bench/compile_once.py [--root DIR] [--target tiny|8b] [--cpu] [--rows abdw]

Run it as bench/gpu_path.py is run (its interpreter is the training environment, ansible-core
importable). Rows are appended to <root>/compile_once.jsonl as they finish, and the table printed
at the end holds every row of that file: a later call with the same --root and --rows dw goes on
where one with --rows ab stopped (the cache and the controller's store are under the root).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_path import REPO, inventory, lock_of_this_python, playbook, target_args
from leftovers import stopped_at_exit


def release_changing(root: Path, name: str, path: str) -> Path:
    """A copy of dflash/ with a comment appended to one file: another release."""
    source = root / name
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "dflash", source / "dflash", ignore=skip)
    with (source / path).open("a") as handle:
        handle.write(f"# {name} (bench/compile_once.py)\n")
    return source


def cache_of(state: Path) -> dict[str, Any]:
    """The running trainer's compile_cache and the newest history line's."""
    try:
        status = json.loads((state / "runs" / "latest" / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    history = state / "history.jsonl"
    last = json.loads(history.read_text().splitlines()[-1]) if history.exists() else {}
    return {"trainer": status.get("compile_cache"), "deploy": last.get("compile_cache")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--target", choices=["tiny", "8b"], default="8b")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--cpu", action="store_true", help="a rehearsal on the CPU (tiny)")
    parser.add_argument(
        "--rows",
        default="abdw",
        help="the rows to run, in this order (default abdw; abcdw adds the model change): b, c "
        "and d need a's cache, w needs d's host",
    )
    args = parser.parse_args()
    if set(args.rows) - set("abcdw"):
        parser.error(f"--rows {args.rows}: rows are a, b, c, d and w")
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print("bench/compile_once.py: no CUDA GPU here; nothing to run (use --cpu to rehearse)")
        return
    root = args.root or Path(tempfile.mkdtemp(prefix="dflash-compile-once-"))
    root.mkdir(parents=True, exist_ok=True)
    gpu = None if args.cpu else args.gpu
    lock = lock_of_this_python()
    trainer = target_args(args.target, root, compile_drafter=True)
    if args.target == "tiny":  # static shapes (compiled) pad every row: short rows on the CPU
        trainer.update(max_seq_len=64, token_budget=128, num_anchors=8, drafter_layers=1)
    store = str(root / "store")
    rows: list[dict] = []
    out = root / "compile_once.jsonl"

    def play(host: str, name: str, step: str, **extra: Any) -> dict:
        here = root / host
        here.mkdir(parents=True, exist_ok=True)
        inv = inventory(here, gpu, lock, trainer)
        extra.setdefault("dflash_compile_cache", "warm")
        row = playbook(here, inv, name, rows, step, dflash_compile_cache_store=store, **extra)
        row.update(cache_of(here / "state"))
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        return row

    def stopped(host: str) -> None:
        """One GPU: a host's trainer stops before the other host's starts."""
        record = root / host / "state" / "trainer.json"
        pid = json.loads(record.read_text()).get("pid") if record.exists() else None
        if pid and Path(f"/proc/{pid}").exists():
            play(host, "playbooks/stop.yml", f"stop {host}", dflash_compile_cache="keep")

    def run_row(name: str) -> None:
        if name in "abc":
            source = {"a": None, "b": "dflash/export.py", "c": "dflash/model.py"}[name]
            step = {
                "a": "(a) cold deploy: warmup compiles, trainer starts on it",
                "b": "(b) release changing export.py",
                "c": "(c) release changing model.py",
            }
            extra = {}
            if source:  # another release: a copy of dflash/ with one file changed
                changed = release_changing(root, f"{name}-changed", source)
                extra["dflash_source_dir"] = str(changed)
            play("h1", "deploy.yml", step[name], **extra)
        elif name == "d":
            stopped("h1")
            play("h2", "deploy.yml", "(d) second host, given h1's cache")
        else:
            play("h2", "deploy.yml", "(w) restart on the warm cache", dflash_restart=True)

    at_exit = {
        root / host / "state": lambda host=host: play(
            host, "playbooks/stop.yml", f"stop {host} (at exit)", dflash_compile_cache="keep"
        )
        for host in ("h1", "h2")
    }  # fmt: skip
    with stopped_at_exit(at_exit):  # also when a row fails midway (bench/leftovers.py)
        for name in args.rows:
            run_row(name)
        for host in ("h1", "h2"):
            stopped(host)
    rows = [json.loads(line) for line in out.read_text().splitlines()]

    device = "CPU" if args.cpu else torch.cuda.get_device_name(args.gpu)
    print(f"\n{device}, torch {torch.__version__}, target {args.target}; under {root}")
    print("| row | playbook s | result | first step s (from process start) | started warm | "
          "hits / misses | cache |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        if "stop" in row["step"]:
            continue
        cache = row["trainer"] or {}
        did = (row["deploy"] or {}).get("did")
        print(f"| {row['step']} | {row['seconds']} | {row['result']} | {row['first_step_s']} "
              f"({cache.get('first_step_s')}) | "
              f"{cache.get('started_warm')} | {cache.get('hits')} / {cache.get('misses')} | "
              f"{did} {cache.get('fingerprint')} |")  # fmt: skip


if __name__ == "__main__":
    main()
