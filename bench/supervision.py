"""Supervision on the local target, as a user sees it: the trainer (CPU, tiny model) deployed by
deploy.yml from this checkout, then killed with SIGKILL --runs times, hung (SIGSTOP), and
finally failing at every start (its data store moved away). Prints the seconds from each kill
to the first training step after it (and their median), and verify.yml's table after the
crashes, after the hang and after the crash loop.

    .venv/bin/python bench/supervision.py [--runs 3] [--backoff 10] [--hang-after 20]

--backoff is dflash_restart_policy.backoff (the product's default: 10 s), so the figure is
back-off + trainer start-up (loading, resuming, the first step). The state root is a temporary
folder; its env is hard-linked from sandbox/envs when `make demo` built one there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from leftovers import stopped_at_exit  # noqa: E402

from tests.helpers import run_playbook  # noqa: E402

ARGS = {"target_model": "tiny", "checkpoint_every": 10}


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def wait(what: str, check, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    sys.exit(f"{what}: not within {timeout} s")


def table(run) -> str:
    text = run.output.split("Show the trainer, its tokens/s and the findings")[1]
    lines = text.split("TASK [")[0].splitlines()
    first = next(i for i, line in enumerate(lines) if "release: " in line)
    return textwrap.dedent("\n".join(lines[first:])).strip()


def prepare_store(folder: Path) -> Path:
    records = folder / "records.jsonl"
    with records.open("w") as out:
        for i in range(200):
            ids = [(i * 7 + j * 13) % 127 for j in range(48)]
            out.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * 40}) + "\n")
    store = folder / "store"
    subprocess.run([sys.executable, "-m", "dflash.data", "prepare", "--out", str(store),
                    "--target-model", "tiny", str(records)], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backoff", type=int, default=10)
    parser.add_argument("--hang-after", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflash-supervision-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        if (REPO / "sandbox" / "envs").is_dir():
            subprocess.run(["cp", "-al", str(REPO / "sandbox" / "envs"), str(root / "envs")],
                           check=True)  # fmt: skip
        store = prepare_store(Path(tmp))
        report = Path(tmp) / "verify.json"
        # tokens/s on a shared machine is noise: neither the gate nor verify judges it here.
        common = {"dflash_root": str(root), "dflash_verify_json": str(report),
                  "dflash_verify_min_throughput_ratio": 0, "dflash_verify_max_cpu_wait": 1,
                  "dflash_min_throughput_ratio": 0}  # fmt: skip
        policy = {"backoff": args.backoff, "backoff_max": max(args.backoff, 300)}
        with stopped_at_exit({root: lambda: run_playbook("playbooks/stop.yml", common)}):
            deploy = run_playbook("deploy.yml", {
                **common, "dflash_trainer_args": ARGS, "dflash_data": str(store),
                "dflash_restart_policy": policy, "dflash_hang_after": args.hang_after,
            }, timeout=1800)  # fmt: skip
            if deploy.rc != 0:
                sys.exit(deploy.output[-4000:])
            status_path = root / "runs" / "latest" / "status.json"

            def status() -> dict:
                return read(status_path)

            def stepping(attempt: int):
                def check():
                    now = status()
                    done = now.get("step", 0) > (now.get("resumed_from_step") or 0)
                    return now if now.get("attempt") == attempt and done else None

                return check

            def verify(after: str) -> None:
                run = run_playbook("verify.yml", common)
                print(f"\n--- verify.yml after {after} (rc {run.rc}) ---\n{table(run)}", flush=True)

            seconds = []
            for attempt in range(1, args.runs + 1):
                before = wait("a checkpoint", lambda a=attempt: (
                    status().get("attempt") == a - 1 and (status().get("checkpoint") or {}).get(
                        "at") and status()))  # fmt: skip
                killed = time.monotonic()
                os.kill(before["pid"], signal.SIGKILL)
                wait("the restarted trainer", stepping(attempt))
                seconds.append(time.monotonic() - killed)
            print(f"kill -9 to the first step after it: {[round(s, 1) for s in seconds]} s; "
                  f"median {statistics.median(seconds):.1f} s (back-off {args.backoff} s, "
                  "doubling for quick failures in a row)", flush=True)  # fmt: skip
            verify(f"{args.runs} crashes")

            hung = status()
            os.kill(hung["pid"], signal.SIGSTOP)
            stopped = time.monotonic()
            wait("the trainer after the hang", stepping(args.runs + 1))
            took = time.monotonic() - stopped
            print(f"\nSIGSTOP to the first step after the restart: {took:.1f} s (hang limit "
                  f"{args.hang_after} s)")  # fmt: skip
            verify("a hang")

            store.rename(store.with_name("store.gone"))
            os.kill(status()["pid"], signal.SIGKILL)
            supervisor = root / "runs" / "latest" / "supervisor.json"
            wait("the crash loop", lambda: read(supervisor).get("state") == "crash_loop", 1200)
            verify("the data store was moved away (a crash loop)")
            run_playbook("playbooks/stop.yml", common)


if __name__ == "__main__":
    main()
