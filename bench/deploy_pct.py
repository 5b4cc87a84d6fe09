"""Deploy and verify over pct on the loopback Proxmox test bed: old transport against new.

    .venv/bin/python bench/deploy_pct.py [--runs 5] [--containers 1 2 4 8]
        [--connections community.proxmox.proxmox_pct_remote dflash_pct+paramiko dflash_pct]
        [--files]

`dflash_pct` runs over its default transport, OpenSSH (one SSH master connection per node
shared by every worker); `dflash_pct+paramiko` over paramiko (a connection per worker). Per
transport and container count (DFLASH_TESTBED_CONTAINERS is not needed: the bed is brought up
with the largest count), each the median of --runs:
`ansible -m ping` of the same containers (the baseline, measured in the same run), a cold
deploy (fresh state root, the torch env pre-seeded by hard links so the env build is not what
is timed), a no-op deploy, verify.yml,
a rollback (after a deploy of an earlier release, which is not timed), their ratios to ping,
and the `pct exec` calls per host of each (from the pct double's trace).
Then one `pct exec VMID -- true` (on the node) and one `lxc-attach -n VMID -- true`, median of
--runs. With --files, the same cold deploy with a dflash/ of 10x more files, to show that the
calls do not grow with the file count. The trainer is not launched (dflash_launch=false): its
CPU start would dominate. verify.yml alone: bench/verify_pct.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import (  # noqa: E402
    ANSIBLE_PLAYBOOK,
    local_env_lock,
    playbook_command,
    playbook_env,
)
from tests.testbed.bed import PCT_CONNECTION, PLAIN_PCT_CONNECTION, Testbed  # noqa: E402

SEED = "/opt/dflash-bench-seed"


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
    # An earlier release to deploy and roll back from (the rollback row).
    subprocess.run([*git, "tag", "earlier"], check=True)
    (repo / "dflash" / "__init__.py").write_text('"""bench: a newer release"""\n')
    subprocess.run([*git, "commit", "-qam", f"x{factor}, newer"], check=True)
    return repo


def fresh_root(bed: Testbed, vmids: list[int], root: str) -> None:
    for vmid in vmids:
        bed.attach(vmid, "sh", "-c", f"rm -rf {root} && mkdir -p {root} && "
                   f"cp -al {SEED}/envs {root}/envs")  # fmt: skip


def calls_per_host(bed: Testbed, mark: int, vmids: list[int]) -> int:
    counts = bed.pct_exec_counts(mark)
    return max(counts[vmid] for vmid in vmids)


def node_seconds(bed: Testbed, command: str, runs: int) -> float:
    """Median wall time of a command run on the node itself (no SSH in the measure)."""
    script = f"s=$(date +%s%N); {command} >/dev/null 2>&1; e=$(date +%s%N); echo $((e - s))"
    times = []
    for _ in range(runs):
        rc, out, err = bed.ssh_run(script)
        if rc != 0:
            sys.exit(f"{command} on the node: {err}")
        times.append(int(out.split()[-1]) / 1e9)
    return statistics.median(times)


def attach_seconds(bed: Testbed, vmid: int, runs: int) -> float:
    """Median wall time of lxc-attach -n VMID -- true, as the bed runs it (clean env)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        bed.attach(vmid, "true")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(bed: Testbed, tmp: Path, connection: str, count: int, runs: int, lock: dict,
            source: Path) -> dict:  # fmt: skip
    vmids = bed.vmids[:count]
    # `dflash_pct+paramiko`: the plugin with that ssh_transport (openssh is its default).
    connection, _, transport = connection.partition("+")
    over = {"dflash_pct_ssh_transport": transport} if transport else {}
    if connection == PCT_CONNECTION:  # its own master connections, not an earlier row's
        over["dflash_pct_control_path_dir"] = tempfile.mkdtemp(prefix="cp", dir="/tmp")
    times: dict[str, list[float]] = {"ping": [], "cold": [], "noop": [], "verify": [],
                                     "rollback": []}  # fmt: skip
    calls: dict[str, list[int]] = {k: [] for k in times}
    tag = connection.rsplit(".", 1)[-1] + (f"-{transport}" if transport else "")
    for run in range(runs):
        root = f"/opt/dflash-bench-{tag}-{count}-{run}"
        fresh_root(bed, vmids, root)
        inv = bed.inventory(tmp / f"inv-{tag}-{count}.yml", vmids=vmids, connection=connection,
                            group_vars={"dflash_env_lock": lock, "dflash_root": root,
                                        **over})  # fmt: skip
        extra = {"dflash_launch": False, "dflash_source_dir": str(source)}
        ping = [str(ANSIBLE_PLAYBOOK).replace("ansible-playbook", "ansible"),
                "-i", str(inv), "all", "-m", "ansible.builtin.ping"]  # fmt: skip
        verify = {"dflash_verify_json": str(tmp / "verify.json")}
        earlier = playbook_command("deploy.yml", {**extra, "dflash_ref": "earlier"}, inv)
        steps = (("ping", ping), ("cold", playbook_command("deploy.yml", extra, inv)),
                 ("noop", playbook_command("deploy.yml", extra, inv)),
                 ("verify", playbook_command("verify.yml", verify, inv)),
                 # the earlier release deployed (not measured), then back to the newer one
                 ("earlier", earlier),
                 ("rollback", playbook_command("rollback.yml", extra, inv)))  # fmt: skip
        for what, cmd in steps:
            mark = bed.trace_mark()
            elapsed = timed(cmd)
            if what in times:
                times[what].append(elapsed)
                calls[what].append(calls_per_host(bed, mark, vmids))
        print(f"{connection}, {count} container(s): run {run + 1}/{runs}", file=sys.stderr)
    return {
        "connection": connection + (f"+{transport}" if transport else ""),
        "containers": count, "runs": runs,
        "seconds": {k: statistics.median(v) for k, v in times.items()},
        "calls": {k: statistics.median(v) for k, v in calls.items()},
    }  # fmt: skip


HEAD = (f"{'transport':<37} {'n':>2} {'ping s':>6} {'cold s':>6} {'no-op s':>7} "
        f"{'verify s':>8} {'rollback s':>10} {'cold/ping':>9} {'no-op/ping':>10} "
        f"{'verify/ping':>11} {'rollback/ping':>13} "
        f"{'pct exec/host cold,no-op,verify,rollback,ping':>46}")  # fmt: skip


def row_line(row: dict) -> str:
    sec, calls = row["seconds"], row["calls"]
    per_host = ",".join(f"{calls[k]:g}" for k in ("cold", "noop", "verify", "rollback", "ping"))
    return (f"{row['connection']:<37} {row['containers']:>2} {sec['ping']:>6.2f} "
            f"{sec['cold']:>6.2f} {sec['noop']:>7.2f} {sec['verify']:>8.2f} "
            f"{sec['rollback']:>10.2f} {sec['cold'] / sec['ping']:>9.2f} "
            f"{sec['noop'] / sec['ping']:>10.2f} {sec['verify'] / sec['ping']:>11.2f} "
            f"{sec['rollback'] / sec['ping']:>13.2f} {per_host:>46}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--containers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--connections", nargs="+",
                        default=[PLAIN_PCT_CONNECTION, f"{PCT_CONNECTION}+paramiko",
                                 PCT_CONNECTION])  # fmt: skip
    parser.add_argument("--files", action="store_true", help="also the 10x-files cold deploy")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/wheelhouse.yml"], cwd=REPO,
                   env=playbook_env(), check=True, capture_output=True)  # fmt: skip
    bed = Testbed.up(containers=max(args.containers))
    rows = []
    file_calls = {}
    try:
        for wheel in (REPO / ".build" / "wheelhouse").glob("*.whl"):
            shutil.copy(wheel, bed.wheelhouse)
        lock = local_env_lock(bed.wheelhouse_ct)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            seed_inv = bed.inventory(
                tmp / "seed.yml", group_vars={"dflash_env_lock": lock, "dflash_root": SEED}
            )
            print("seeding the torch env in every container ...", file=sys.stderr)
            timed(playbook_command("deploy.yml", {"dflash_launch": False}, seed_inv))
            sources = {1: source_with_files(tmp, 1)}
            for count in args.containers:
                for connection in args.connections:
                    rows.append(measure(bed, tmp, connection, count, args.runs, lock, sources[1]))
                    # each row as soon as it is measured: a long run can be cut short
                    print(f"{HEAD}\n{row_line(rows[-1])}", file=sys.stderr)
                    if args.json:
                        args.json.write_text(json.dumps({"rows": rows}, indent=1))
            vmid = bed.vmids[0]
            pct_s = node_seconds(bed, f"/usr/sbin/pct exec {vmid} -- true", args.runs)
            attach_s = attach_seconds(bed, vmid, args.runs)
            if args.files:
                sources[10] = source_with_files(tmp, 10)
                root = "/opt/dflash-bench-files"
                for factor, repo in sources.items():
                    fresh_root(bed, [vmid], root)
                    group_vars = {"dflash_env_lock": lock, "dflash_root": root}
                    inv = bed.inventory(tmp / "inv-files.yml", vmids=[vmid], group_vars=group_vars)
                    extra = {"dflash_launch": False, "dflash_source_dir": str(repo)}
                    mark = bed.trace_mark()
                    timed(playbook_command("deploy.yml", extra, inv))
                    n_files = sum(1 for _ in (repo / "dflash").rglob("*") if _.is_file())
                    file_calls[factor] = (n_files, bed.pct_exec_counts(mark)[vmid])
    finally:
        bed.down()
    print(HEAD)
    for row in rows:
        print(row_line(row))
    print(
        f"pct exec {vmid} -- true on the node: {pct_s:.3f} s; "
        f"lxc-attach -n {vmid} -- true: {attach_s:.3f} s (median of {args.runs})"
    )
    for factor, (n_files, calls) in file_calls.items():
        print(f"dflash/ with {n_files} files (x{factor}): {calls} pct exec calls in a cold deploy")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "pct_exec_true_s": pct_s,
                                         "lxc_attach_true_s": attach_s}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
