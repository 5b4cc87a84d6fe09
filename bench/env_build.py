"""The demo's env build with each installer, as library/dflash_env.py runs it: a fresh venv, then
the lock's wheels from the wheelhouse with --no-deps and their hashes (uv from its wheel in the
wheelhouse, pip from its own), medians of --runs, the ratio measured in the same run.

    .venv/bin/python bench/env_build.py [--runs 3]

Needs the wheelhouse filled (ansible-playbook playbooks/wheelhouse.yml)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (  # noqa: E402
    requirement_lines,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_envcheck import (  # noqa: E402
    check_wheelhouse,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_installer import (  # noqa: E402
    install_command,
)
from tests.helpers import local_env_lock  # noqa: E402


def build_once(lock: dict, files: dict, where: Path) -> float:
    env_dir = where / "env"
    shutil.rmtree(env_dir, ignore_errors=True)
    reqs = where / "reqs.txt"
    reqs.write_text("\n".join(requirement_lines(lock)) + "\n")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    workdir = Path(tempfile.mkdtemp(dir=where))
    cmd, env, _what = install_command(lock, str(env_dir / "bin" / "python"), files, str(workdir))
    subprocess.run([*cmd, "-r", str(reqs)], env=env, check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    shutil.rmtree(workdir)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    lock = local_env_lock()
    files = check_wheelhouse(lock, lock["source"]["wheelhouse"])
    if not any(name == "uv" for name, _ in files):
        sys.exit("no uv wheel in the wheelhouse: ansible-playbook playbooks/wheelhouse.yml")
    without_uv = {key: path for key, path in files.items() if key[0] != "uv"}
    times: dict[str, list[float]] = {"pip": [], "uv": []}
    with tempfile.TemporaryDirectory(dir=REPO / ".build") as tmp:
        for run in range(args.runs):
            for name, given in (("pip", without_uv), ("uv", files)):
                times[name].append(build_once(lock, given, Path(tmp)))
                print(f"run {run + 1} {name}: {times[name][-1]:.1f} s", flush=True)
    pip, uv = statistics.median(times["pip"]), statistics.median(times["uv"])
    print(f"env build of {len(files)} wheels, median of {args.runs}: pip {pip:.1f} s, "
          f"uv {uv:.1f} s ({pip / uv:.1f}x), os.cpu_count() {os.cpu_count()}")  # fmt: skip


if __name__ == "__main__":
    main()
