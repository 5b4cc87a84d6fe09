"""The whole toolkit path on a GPU machine, as a user runs it, with the local connection:
deploy.yml (a GPU run.sh, torchrun, the compile cache fingerprinted with the GPU's name, the
health gate on GPU tokens/s) -> verify.yml -> a warm compile cache and a restart -> a release
with changed code -> rollback.yml -> verify.yml -> stop.yml. Prints one table: step, seconds,
result, and for each deploy the time from the trainer's start to its first step, tokens/s at
the health check and the seconds by role.

    python3 bench/gpu_path.py [--root DIR] [--target tiny|8b|both] [--gpu 0]

Run it from the repository root with the Python that holds torch (its interpreter is adopted
as the training environment: `dflash_env_lock.source.python`), with ansible-core importable
(`python3 -m ansible`). Everything it writes stays under --root (default: a new temp folder).
The `8b` target is bench/trainer/pipeline.py's random Qwen3-8B-shaped one (a cold compile
of its drafter step takes minutes). Without a CUDA GPU it exits 0 saying so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from leftovers import stopped_at_exit

REPO = Path(__file__).resolve().parent.parent
# What the trainer imports besides torch and triton, pinned to what this interpreter holds.
PINNED = ("transformers", "safetensors", "tokenizers", "huggingface-hub", "numpy")


def lock_of_this_python() -> dict[str, Any]:
    import torch

    wheels = {name: importlib.metadata.version(name) for name in PINNED}
    triton = importlib.metadata.version("triton") if torch.version.cuda else None
    return {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "torch": torch.__version__,
        "triton": triton,
        "cuda": torch.version.cuda,
        "wheels": wheels,
        "source": {"python": sys.executable},
    }


def inventory(
    root: Path, gpu: int | None, lock: dict, args: dict, quick_restarts: bool = False
) -> Path:
    gpus = [] if gpu is None else [gpu]
    args = dict(args)
    data = args.pop("data", None)  # the data is dflash_data's, not a trainer flag
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "dflash_root": str(root / "state"),
        "dflash_env_lock": lock,
        "dflash_target_gpus": gpus,
        "dflash_drafter_gpus": gpus,
        "dflash_colocated": bool(gpus),
        "dflash_trainer_args": args,
        **({"dflash_data": data} if data else {}),
        "dflash_health_timeout": 900,
        "dflash_stop_timeout": 180,
        # The health steps and the throughput gate as a user gets them (the defaults).
    }
    if quick_restarts:  # restarts timed one after another: a back-off of 1 s, not 10 doubling
        host["dflash_restart_policy"] = {"backoff": 1}
    path = root / "inventory.json"
    path.write_text(json.dumps({"all": {"children": {"dflash_targets": {"hosts": {"gpu": host}}}}}))
    return path


class FirstStep(threading.Thread):
    """Watches runs/latest/status.json while a playbook runs: seconds from the trainer's start
    (its status' started_at) to its first training step."""

    def __init__(self, state: Path) -> None:
        super().__init__(daemon=True)
        self.state, self.seconds = state, None
        self.done = threading.Event()
        self.before = self.run_id()

    def run_id(self) -> str | None:
        try:
            return json.loads((self.state / "trainer.json").read_text()).get("run_id")
        except (OSError, ValueError):
            return None

    def run(self) -> None:
        while not self.done.wait(0.1):
            try:
                status = json.loads((self.state / "runs" / "latest" / "status.json").read_text())
            except (OSError, ValueError):
                continue
            fresh = self.run_id() not in (None, self.before)
            if fresh and status.get("step", 0) >= 1 and self.seconds is None:
                started = datetime.fromisoformat(status["started_at"]).timestamp()
                self.seconds = round(time.time() - started, 1)


def playbook(root: Path, inv: Path, name: str, rows: list, step: str, **extra: Any) -> dict:
    times = root / f"roles-{len(rows)}.json"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        # Added to ansible.cfg's folder, not in its place: the stdout callback lives there.
        ANSIBLE_CALLBACK_PLUGINS=os.pathsep.join(
            [str(REPO / "bench" / "callback_plugins"), str(REPO / "callback_plugins")]
        ),
        ANSIBLE_CALLBACKS_ENABLED="dflash_role_times",
        DFLASH_ROLE_TIMES=str(times),
        ANSIBLE_NOCOLOR="1",
        # The plugins and modules import the collection dflash.deploy: ansible.cfg names it, and
        # the checkout's root on the path finds it too (this interpreter is not make venv's).
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    extra.setdefault("dflash_verify_json", str(root / "reports" / "verify.json"))
    watch = FirstStep(root / "state")
    watch.start()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ansible", "playbook", "-i", str(inv), str(REPO / name),
         "-e", json.dumps(extra)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = round(time.monotonic() - started, 1)
    watch.done.set()
    log = root / f"{len(rows):02d}-{step.replace(' ', '-')}.log"
    log.write_text(proc.stdout + proc.stderr)
    history = root / "state" / "history.jsonl"
    last = json.loads(history.read_text().splitlines()[-1]) if history.exists() else {}
    row = {
        "step": step,
        "seconds": seconds,
        "result": "ok" if proc.returncode == 0 else f"rc {proc.returncode} (see {log})",
        "first_step_s": watch.seconds,
        "tokens_per_s": last.get("tokens_per_s") if name.endswith("deploy.yml") else None,
        "roles": json.loads(times.read_text()) if times.exists() else {},
    }
    rows.append(row)
    print(json.dumps(row), flush=True)
    return row


def changed_source(root: Path) -> Path:
    """A copy of dflash/ with one line changed: another tree, another cache fingerprint."""
    source = root / "source-v2"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "dflash", source / "dflash", ignore=skip)
    with (source / "dflash" / "__init__.py").open("a") as handle:
        handle.write("# a changed release (bench/gpu_path.py)\n")
    return source


def target_args(
    kind: str, root: Path, compile_drafter: bool, checkpoints: bool = False
) -> dict[str, Any]:
    # With restarts to time, the 8b trainer saves every 40 steps (~10 s at its shape).
    common = {"compile_drafter": compile_drafter, "log_every": 1, "keep_checkpoints": 1,
              "checkpoint_every": 40 if checkpoints else 1000000}  # fmt: skip
    if kind == "tiny":  # checkpoints often: the supervised restart resumes from one
        return {"target_model": "tiny", "gen_samples": 64, **common, "checkpoint_every": 20}
    sys.path.insert(0, str(REPO / "bench" / "trainer"))
    from pipeline import ANCHORS, BLOCK, DRAFTER_LAYERS, SEQ, prepare

    folder, data, _config = prepare(root / "qwen3-8b", 24)
    return {
        "target_model": str(folder), "target_random_init": True, "mask_token_id": 151935,
        "data": str(data), "max_seq_len": SEQ, "num_anchors": ANCHORS, "block_size": BLOCK,
        "drafter_layers": DRAFTER_LAYERS, **common,
    }  # fmt: skip


def path_for(
    kind: str,
    root: Path,
    gpu: int | None,
    rows: list,
    compile_drafter: bool,
    quick: bool,
    recoveries: int = 0,
) -> None:
    root.mkdir(parents=True)
    args = target_args(kind, root, compile_drafter, checkpoints=bool(recoveries))
    inv = inventory(root, gpu, lock_of_this_python(), args, quick_restarts=bool(recoveries))
    play = lambda name, step, **extra: playbook(root, inv, name, rows, f"{kind}: {step}", **extra)  # noqa: E731
    # Stopped at the end whatever happens in between (bench/leftovers.py).
    with stopped_at_exit({root / "state": lambda: play("playbooks/stop.yml", "stop (at exit)")}):
        walk(kind, root, gpu, rows, quick, recoveries, play)


def walk(
    kind: str, root: Path, gpu: int | None, rows: list, quick: bool, recoveries: int, play: Any
) -> None:
    """The user's path on one target: deploys, verifies, a restart, a rollback, the stop."""
    cold = play("deploy.yml", "deploy (compile cache cold)", dflash_compile_cache="clear")
    if cold["result"] != "ok":
        return  # what follows needs a deployment; the log says why
    play("verify.yml", "verify")
    if kind == "tiny" and gpu is not None:
        foreign_process_on_the_gpu(root, gpu, rows, play)
    if kind == "tiny" or recoveries:
        supervised_restarts(root, rows, play, recoveries or 1)
    if kind == "tiny" and not quick:
        play("deploy.yml", "warm the cache + restart", dflash_compile_cache="warm",
             dflash_restart=True)  # fmt: skip
    first = json.loads((root / "state" / "history.jsonl").read_text().splitlines()[-1])
    if kind == "tiny":
        # --quick stages the changed release (its new cache folder) without its cold compile.
        play("deploy.yml", "deploy changed code (new fingerprint)",
             dflash_source_dir=str(changed_source(root)), dflash_launch=not quick)  # fmt: skip
        if not quick:
            play("verify.yml", "verify")
        play("rollback.yml", "rollback to the first release", dflash_release=first["release"])
        play("verify.yml", "verify")
    elif not recoveries:  # the timed restarts above were warm restarts already
        play("deploy.yml", "restart (compile cache warm)", dflash_restart=True)
    play("playbooks/stop.yml", "stop")


def epoch(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def resumed_at(log: Path, since: float) -> float | None:
    """When the trainer logged `resumed from ...` (its checkpoint loaded) at or after `since`."""
    for line in log.read_text(errors="replace").splitlines():
        stamp, _, rest = line.partition(" ")
        if rest.startswith("resumed from ") and (at := epoch(stamp)) and at >= since:
            return at
    return None


def saved(status: dict, attempt: int) -> bool:
    """This attempt of the trainer saved a checkpoint (a resumed one's names the one it read,
    without `at`)."""
    return status.get("attempt", 0) == attempt and bool((status.get("checkpoint") or {}).get("at"))


def supervised_restarts(root: Path, rows: list, play: Any, count: int) -> None:
    """A rank killed (SIGKILL) under torchrun, `count` times, each once the trainer saved a
    checkpoint: the supervisor restarts torchrun after its back-off and the trainer resumes
    from its newest checkpoint; verify stays ok and names the restarts. Each row: seconds from
    the kill to the first step after it, and where they went: the supervisor's back-off, the
    new process to its checkpoint loaded (interpreter, torch, the target's build, the load), to
    its first step (compiles from the warm cache, the step)."""
    run = root / "state" / "runs" / "latest"

    def status() -> dict:
        try:
            return json.loads((run / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    seconds = []
    for attempt in range(1, count + 1):
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not saved(status(), attempt - 1):
            time.sleep(0.2)
        before = status()
        killed, killed_at = time.monotonic(), time.time()
        os.kill(before["pid"], 9)
        back: dict = {}
        while time.monotonic() < killed + 900:
            back = status()
            if back.get("attempt") == attempt and back.get("step", 0) > (
                back.get("resumed_from_step") or 0
            ):
                break
            time.sleep(0.1)
        took = round(time.monotonic() - killed, 1)
        seconds.append(took)
        started, first = epoch(back.get("started_at")), epoch(back.get("first_step_at"))
        loaded = resumed_at(run / "train.log", started or killed_at)
        parts = {
            "to the new process": round(started - killed_at, 1) if started else None,
            "to its checkpoint loaded": round(loaded - started, 1) if loaded and started else None,
            "to its first step": round(first - loaded, 1) if first and loaded else None,
        }
        cache = back.get("compile_cache") or {}
        rows.insert(len(rows), {
            "step": f"kill -9 of the rank #{attempt}: supervised restart", "seconds": took,
            "result": f"attempt {back.get('attempt')}, resumed from step "
                      f"{back.get('resumed_from_step')} (killed at step {before.get('step')}); "
                      + ", ".join(f"{k} {v} s" for k, v in parts.items())
                      + f"; cache {cache.get('hits')} hits / {cache.get('misses')} misses",
            "first_step_s": took, "tokens_per_s": back.get("tokens_per_s"), "roles": {},
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    row = play("verify.yml", f"verify after {count} restart(s)")
    report = json.loads((root / "reports" / "verify.json").read_text())["hosts"]["gpu"]
    supervision = report.get("supervision") or {}
    restarts = (supervision.get("restarts") or {}).get("count")
    ratio = (supervision.get("goodput") or {}).get("ratio")
    row["result"] += (
        f"; {report['verdict']}, restarts {restarts}, goodput {ratio}; kill to first step "
        f"median {statistics.median(seconds)} s of {seconds}"
    )


HOLD_MIB = 2048


def foreign_process_on_the_gpu(root: Path, gpu: int, rows: list, play: Any) -> None:
    """A second process holds memory on the job's GPU: verify's gpu finding must name its pid
    and memory; once it is gone, verify is clean again."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time, torch; x = torch.empty({HOLD_MIB} << 20, "
         f"dtype=torch.uint8, device='cuda:{gpu}'); print('holding', flush=True); "
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    try:
        row = play("verify.yml", f"verify, a second process (pid {holder.pid}) holding "
                   f"{HOLD_MIB} MiB on GPU {gpu}")  # fmt: skip
        report = json.loads((root / "reports" / "verify.json").read_text())
        found = [f for f in report["hosts"]["gpu"]["findings"] if f["kind"] == "gpu"]
        named = [f for f in found if str(holder.pid) in json.dumps(f)]
        row["result"] = (
            f"gpu finding names pid {holder.pid}: {named[0]['found']}" if named
            else f"not named ({found or 'no gpu finding'})"
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    play("verify.yml", "verify, the second process gone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--target", choices=["tiny", "8b", "both"], default="tiny")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument(
        "--cpu", action="store_true", help="a rehearsal of the same path on the CPU (tiny only)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one cold compile only: no warm restart, the changed release staged, not launched",
    )
    parser.add_argument(
        "--recoveries", type=int, default=0,
        help="kill -9 the rank this many times, each after a checkpoint, and time each restart "
             "to its first step (the 8b target too; the tiny one always once)",
    )  # fmt: skip
    parser.add_argument(
        "--eager", action="store_true",
        help="no --compile-drafter (flex_attention still compiles): a shorter cold start",
    )  # fmt: skip
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print("bench/gpu_path.py: no CUDA GPU here; nothing to run (it runs on a GPU machine)")
        return
    root = args.root or Path(tempfile.mkdtemp(prefix="dflash-gpu-path-"))
    rows: list[dict] = []
    kinds = ["tiny", "8b"] if args.target == "both" else [args.target]
    for kind in kinds:
        gpu = None if args.cpu else args.gpu
        compiled = gpu is not None and not args.eager
        path_for(kind, root / kind, gpu, rows, compiled, args.quick, args.recoveries)
    device = "CPU" if args.cpu else torch.cuda.get_device_name(args.gpu)
    print(f"\n{device}, torch {torch.__version__}; under {root}")
    print("| step | seconds | result | first step s | tokens/s | slowest roles (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        roles = sorted(row["roles"].items(), key=lambda kv: -kv[1])[:3]
        slow = ", ".join(f"{name} {sec:.1f}" for name, sec in roles)
        print(f"| {row['step']} | {row['seconds']} | {row['result']} | {row['first_step_s']} "
              f"| {row['tokens_per_s']} | {slow} |")  # fmt: skip
    (root / "gpu_path.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
