"""verify.yml over pct on the loopback Proxmox test bed for 1, 2 and 4 containers, and the
deployed-state suite (tests/deployed) on 2.

    .venv/bin/python bench/verify_pct.py [--runs 5] [--containers 1 2 4] [--suite-containers 2]

Every container holds one deployment (the working tree, staged with dflash_launch=false: a CPU
trainer in each of 4 containers on a small machine would time the CPU, not the audit), made by
one deploy at the start. Per container count, each median of --runs: `ansible -m ping` of the
same containers (the baseline, measured in the same run), verify.yml, their ratio, verify per
host, and the `pct exec` calls per host of one verify (from the pct double's trace). Then
`pytest tests/deployed --inventory FILE` against --suite-containers containers. Goals: verify
under 3 s per host, the suite under 10 s.

`.venv/bin/python bench/verify_pct.py --runs 5` on the 2-core development machine, idle
(2026-11-30, after the reports moved into the role's action plugin):

    containers  ping s  verify s verify/ping verify/host s pct exec/host
             1    1.66      2.14        1.29          2.14             6
             2    1.55      2.11        1.37          1.06             6
             4    1.80      2.64        1.47          0.66             6
    verify per host: worst 2.14 s (goal < 3 s: met)
    deployed-state suite on 2 containers: median 3.15 s, min 3.01, max 3.30 (goal < 10 s: met)

Before (reports written by file + copy + template, three module runs on the controller; the
suite importing torch through tests/conftest.py), with other jobs loading the machine (load 5):
verify 7.62 / 8.17 / 8.35 s for 1 / 2 / 4 containers (2.5-2.7x ping), suite 11.64 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.deploy_pct import SEED, local_lock, timed  # noqa: E402
from tests.deployed.suite_run import run_suite  # noqa: E402
from tests.helpers import ANSIBLE_PLAYBOOK, playbook_command, playbook_env  # noqa: E402
from tests.testbed.bed import Testbed  # noqa: E402

ANSIBLE = ANSIBLE_PLAYBOOK.with_name("ansible")
VERIFY_GOAL_S = 3.0
SUITE_GOAL_S = 10.0


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--containers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--suite-containers", type=int, default=2)
    args = parser.parse_args()
    subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/wheelhouse.yml"], cwd=REPO,
                   env=playbook_env(), check=True, capture_output=True)  # fmt: skip
    bed = Testbed.up(containers=max([*args.containers, args.suite_containers]))
    rows = []
    try:
        for wheel in (REPO / ".build" / "wheelhouse").glob("*.whl"):
            shutil.copy(wheel, bed.wheelhouse)
        group_vars = {"dflash_env_lock": local_lock(bed.wheelhouse_ct), "dflash_root": SEED}
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            print("deploying (with the torch env) into every container ...", file=sys.stderr)
            seed = bed.inventory(tmp / "seed.yml", group_vars=group_vars)
            timed(playbook_command("deploy.yml", {"dflash_launch": False}, seed))
            extra = {"dflash_verify_json": str(tmp / "verify.json")}
            for count in args.containers:
                inv = bed.inventory(tmp / f"inv-{count}.yml", vmids=bed.vmids[:count],
                                    group_vars=group_vars)  # fmt: skip
                ping = [str(ANSIBLE), "-i", str(inv), "all", "-m", "ansible.builtin.ping"]
                times: dict[str, list[float]] = {"ping": [], "verify": []}
                calls: list[int] = []
                for run in range(args.runs):
                    times["ping"].append(timed(ping))
                    mark = bed.trace_mark()
                    times["verify"].append(timed(playbook_command("verify.yml", extra, inv)))
                    calls.append(max(bed.pct_exec_counts(mark).values()))
                    print(f"{count} container(s): run {run + 1}/{args.runs}", file=sys.stderr)
                rows.append((count, times, median(calls)))
            inv = bed.inventory(tmp / "suite.yml", vmids=bed.vmids[: args.suite_containers],
                                group_vars=group_vars)  # fmt: skip
            suite: list[float] = []
            for run in range(args.runs):
                result = run_suite(inv, tmp / f"suite-{run}.xml")
                if result.rc != 0:
                    sys.exit(f"the deployed-state suite failed:\n{result.output[-3000:]}")
                suite.append(result.seconds)
                print(f"suite: run {run + 1}/{args.runs}", file=sys.stderr)
    finally:
        bed.down()
    lines = [
        f"{'containers':>10} {'ping s':>7} {'verify s':>9} {'verify/ping':>11} "
        f"{'verify/host s':>13} {'pct exec/host':>13}"
    ]
    for count, times, calls in rows:
        ping, verify = median(times["ping"]), median(times["verify"])
        lines.append(f"{count:>10} {ping:>7.2f} {verify:>9.2f} {verify / ping:>11.2f} "
                     f"{verify / count:>13.2f} {calls:>13.0f}")  # fmt: skip
    worst = max(median(t["verify"]) / count for count, t, _ in rows)
    lines.append(
        f"verify per host: worst {worst:.2f} s (goal < {VERIFY_GOAL_S:g} s: "
        f"{'met' if worst < VERIFY_GOAL_S else 'MISSED'})"
    )
    lines.append(
        f"deployed-state suite on {args.suite_containers} containers: median "
        f"{median(suite):.2f} s, min {min(suite):.2f}, max {max(suite):.2f} (goal < "
        f"{SUITE_GOAL_S:g} s: {'met' if median(suite) < SUITE_GOAL_S else 'MISSED'})"
    )
    print(f"median of {args.runs} runs")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
