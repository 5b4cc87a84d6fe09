"""Deploy over pct on the loopback Proxmox test bed, for 1, 2 and 4 containers.

    .venv/bin/python bench/deploy_pct.py [--runs 5] [--containers 1 2 4]

Per container count: cold deploy (fresh state root, the torch env pre-seeded by hard links so
the env build is not what is timed) and no-op deploy, each the median of --runs,
and the number of `pct exec` calls per host read from the pct double's trace. Then the same
cold deploy with a dflash/ of 10x more files, to show that the calls do not grow with the file
count. The baseline measured in the same run is `ansible -m ping` of all the containers.
The trainer is not launched (dflash_launch=false): its CPU start would dominate.
verify.yml and the deployed-state suite have their own benchmark: bench/verify_pct.py.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import yaml  # noqa: E402

from tests.helpers import ANSIBLE_PLAYBOOK, playbook_command, playbook_env  # noqa: E402
from tests.testbed.bed import Testbed  # noqa: E402

SEED = "/opt/dflash-bench-seed"


def local_lock(wheelhouse: str) -> dict:
    inventory = yaml.safe_load((REPO / "inventory" / "local.yml").read_text())
    lock = inventory["all"]["children"]["dflash_targets"]["hosts"]["local"]["dflash_lock"]
    return dict(lock, source={"wheelhouse": wheelhouse})


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=playbook_env(), capture_output=True, text=True,
                          check=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return elapsed


def source_with_files(tmp: Path, factor: int) -> Path:
    """A git checkout of dflash/ with (factor - 1) extra copies of every module."""
    repo = tmp / f"source-x{factor}"
    shutil.copytree(REPO / "dflash", repo / "dflash",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    files = [p for p in (repo / "dflash").rglob("*.py")]
    for copy in range(1, factor):
        for path in files:
            (path.parent / f"{path.stem}_copy{copy}.py").write_text(path.read_text())
    git = ["git", "-C", str(repo), "-c", "user.email=b@example.invalid", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", f"x{factor}"], check=True)
    return repo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--containers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/wheelhouse.yml"], cwd=REPO,
                   env=playbook_env(), check=True, capture_output=True)  # fmt: skip
    bed = Testbed.up(containers=max(args.containers))
    rows = []
    try:
        for wheel in (REPO / ".build" / "wheelhouse").glob("*.whl"):
            shutil.copy(wheel, bed.wheelhouse)
        lock = local_lock(bed.wheelhouse_ct)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            seed_inv = bed.inventory(
                tmp / "seed.yml", group_vars={"dflash_lock": lock, "dflash_root": SEED}
            )
            print("seeding the torch env in every container ...", file=sys.stderr)
            timed(playbook_command("deploy.yml", {"dflash_launch": False}, seed_inv))
            sources = {1: source_with_files(tmp, 1), 10: source_with_files(tmp, 10)}
            for count in args.containers:
                vmids = bed.vmids[:count]
                times: dict[str, list[float]] = {"ping": [], "cold": [], "noop": []}
                calls: list[int] = []
                for run in range(args.runs):
                    root = f"/opt/dflash-bench-{count}-{run}"
                    for vmid in vmids:
                        bed.attach(vmid, "sh", "-c", f"rm -rf {root} && mkdir -p {root} && "
                                   f"cp -al {SEED}/envs {root}/envs")  # fmt: skip
                    inv = bed.inventory(
                        tmp / f"inv-{count}.yml",
                        vmids=vmids,
                        group_vars={"dflash_lock": lock, "dflash_root": root},
                    )
                    extra = {"dflash_launch": False, "dflash_source_dir": str(sources[1])}
                    ping = [str(ANSIBLE_PLAYBOOK).replace("ansible-playbook", "ansible"),
                            "-i", str(inv), "all", "-m", "ansible.builtin.ping"]  # fmt: skip
                    times["ping"].append(timed(ping))
                    mark = bed.trace_mark()
                    times["cold"].append(timed(playbook_command("deploy.yml", extra, inv)))
                    calls.append(max(bed.pct_exec_counts(mark).values()))
                    times["noop"].append(timed(playbook_command("deploy.yml", extra, inv)))
                    print(f"{count} container(s): run {run + 1}/{args.runs}", file=sys.stderr)
                rows.append((count, times, statistics.median(calls)))
            # The same cold deploy with 10x more files: the pct exec calls must not grow.
            root = "/opt/dflash-bench-files"
            file_calls = {}
            for factor, repo in sources.items():
                bed.attach(bed.vmids[0], "sh", "-c", f"rm -rf {root} && mkdir -p {root} && "
                           f"cp -al {SEED}/envs {root}/envs")  # fmt: skip
                inv = bed.inventory(
                    tmp / "inv-files.yml",
                    vmids=bed.vmids[:1],
                    group_vars={"dflash_lock": lock, "dflash_root": root},
                )
                mark = bed.trace_mark()
                timed(
                    playbook_command(
                        "deploy.yml", {"dflash_launch": False, "dflash_source_dir": str(repo)}, inv
                    )
                )
                n_files = sum(1 for _ in (repo / "dflash").rglob("*") if _.is_file())
                file_calls[factor] = (n_files, bed.pct_exec_counts(mark)[bed.vmids[0]])
    finally:
        bed.down()
    print(f"{'containers':>10} {'ping s':>7} {'cold s':>7} {'no-op s':>8} {'cold/ping':>9} "
          f"{'pct exec/host':>13}")  # fmt: skip
    for count, times, calls in rows:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{count:>10} {med['ping']:>7.2f} {med['cold']:>7.2f} {med['noop']:>8.2f} "
              f"{med['cold'] / med['ping']:>9.2f} {calls:>13.0f}")  # fmt: skip
    for factor, (n_files, calls) in file_calls.items():
        print(f"dflash/ with {n_files} files (x{factor}): {calls} pct exec calls in a cold deploy")


if __name__ == "__main__":
    main()
