"""verify's `gpu` finding: nvidia-smi's output parsed (module_utils/dflash_gpu.py), its
processes matched to the job's by pid namespace as real processes see them, and judged
against the job's layout (filter_plugins/dflash_verify_gpu.py).

nvidia-smi's CSV is given as text (no GPU here). The processes are real: a job (found by
its DFLASH_ROOT marker, as dflash_facts finds trainers) and a stranger in a pid namespace of
their own (`unshare --pid`, a container's view), read from inside it and from outside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dflash_verify_gpu_filters import gpu_findings

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_gpu import (
    in_init_pid_namespace,
    judge,
    parse_apps,
    parse_gpus,
    view,
)
from tests.helpers import REPO

G0, G1 = "GPU-0a0a0a0a-0000-0000-0000-000000000000", "GPU-1b1b1b1b-0000-0000-0000-000000000000"
GPUS_CSV = (
    f"0, {G0}, NVIDIA H200, 00000000:19:00.0, 74000, 143771, 570.124.06\n"
    f"1, {G1}, NVIDIA H200, 00000000:3B:00.0, 1, 143771, 570.124.06\n"
)


def probe(apps_csv: str, seen: dict, gpus_csv: str = GPUS_CSV) -> dict:
    """What dflash_gpu.probe returns, from nvidia-smi's text and a view of the processes."""
    gpus, problems = parse_gpus(gpus_csv)
    return {"smi": "/usr/bin/nvidia-smi", "gpus": gpus, "problems": problems,
            "apps": parse_apps(apps_csv), **seen}  # fmt: skip


def test_parse_gpus_and_apps_as_nvidia_smi_prints_them():
    text = GPUS_CSV + (
        "2, GPU-2c, NVIDIA H200, 00000000:5D:00.0, [GPU is lost], [GPU is lost], 570.124.06\n"
        "Unable to determine the device handle for GPU0000:9A:00.0: Unknown Error\n"
    )
    gpus, problems = parse_gpus(text)
    assert [(g["index"], g["memory_used_mib"], g["lost"]) for g in gpus] == [
        (0, 74000, None), (1, 1, None), (2, None, "GPU is lost")
    ]  # fmt: skip
    assert gpus[0]["bus_id"] == "00000000:19:00.0" and gpus[0]["memory_total_mib"] == 143771
    assert problems == ["GPU 0000:9A:00.0: Unknown Error"]
    apps = parse_apps(
        f"4242, /opt/dflash/envs/lock-1/bin/python, 70000, {G0}\n"
        f"77, python -c import torch, x, [N/A], {G1}\n"
        "No running processes found\n"
    )
    assert apps == [
        {"pid": 4242, "name": "/opt/dflash/envs/lock-1/bin/python", "used_mib": 70000,
         "gpu_uuid": G0},
        {"pid": 77, "name": "python -c import torch, x", "used_mib": None, "gpu_uuid": G1},
    ]  # fmt: skip


def test_without_nvidia_smi_or_gpus_in_the_layout_the_check_does_not_apply():
    assert judge({"smi": None}, [0], True) == {
        "applies": False, "why": "no nvidia-smi on the target (a CPU target)"
    }  # fmt: skip
    assert judge(probe("", {"in_init_pid_namespace": True, "job": [], "local": []}), [], True)[
        "why"] == "the layout uses no GPU (CPU mode)"  # fmt: skip


def test_a_missing_or_lost_gpu_and_memory_no_process_holds_are_named():
    gpus_csv = GPUS_CSV.replace(", 1, 143771", ", 9000, 143771") + (
        "Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost.  Reboot the "
        "system to recover this GPU\n"
    )
    seen = {"in_init_pid_namespace": True, "job": [{"pid": 10, "ns": [10]}], "local": []}
    found = probe(f"10, python, 73000, {G0}\n", seen, gpus_csv)
    facts = {
        "deployment": {"run_sh": {"layout": {"mode": "split", "target": [0], "drafter": [1, 2]}}},
        "trainers": {"processes": [{"pid": 10}]},
        "gpu": found,
    }
    by_gpu = {item["gpu"]: item for item in gpu_findings(facts)}
    assert sorted(by_gpu) == [1, 2]
    assert by_gpu[2]["found"].startswith("GPU 2 not listed by nvidia-smi; nvidia-smi: GPU ")
    assert "GPU is lost" in by_gpu[2]["found"] and "Xid 79" in by_gpu[2]["hint"]
    # GPU 1: 9000 MiB in use and no process listed; GPU 0: 74000 in use, 73000 listed (fine).
    assert by_gpu[1]["found"] == "9000 MiB in use, 0 MiB by listed processes"
    # Without every process's share nothing adds up: not judged.
    found["apps"][0]["used_mib"] = None
    found["apps"].append({"pid": 10, "name": "python", "used_mib": None, "gpu_uuid": G1})
    assert [f["gpu"] for f in gpu_findings(facts)] == [2]


@pytest.fixture
def namespace(tmp_path: Path) -> Iterator[dict]:
    """A job (marked with DFLASH_ROOT, as run.sh marks the trainer) and a stranger, in a pid
    namespace of their own; `ask(csv)` has a reader inside it (dflash_gpu.view, as dflash_facts
    calls it in a container) return its view of the processes nvidia-smi's CSV names."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to make a pid namespace")
    root = tmp_path / "dflash"
    root.mkdir()
    inner = tmp_path / "inner.py"
    inner.write_text(INNER)
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(inner),
         str(REPO), str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids = json.loads(proc.stdout.readline())

        def ask(csv: str) -> dict:
            proc.stdin.write(json.dumps(csv) + "\n")
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        # The same processes from this (the initial) pid namespace: NStgid is "outer inner".
        outer = {}
        for name in os.listdir("/proc"):
            ns = _nstgid(name)
            if ns and len(ns) == 2 and ns[1] in pids.values() and _parent_ns(name, proc.pid):
                outer[next(k for k, v in pids.items() if v == ns[1])] = ns[0]
        yield {"inner": pids, "outer": outer, "ask": ask}
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


INNER = """
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.dflash.deploy.plugins.module_utils import dflash_gpu, dflash_procs
root = sys.argv[2]
job = subprocess.Popen(["sleep", "300"], env=dict(os.environ, DFLASH_ROOT=root))
stranger = subprocess.Popen(["sleep", "301"])
print(json.dumps({"job": job.pid, "stranger": stranger.pid}), flush=True)
for line in sys.stdin:
    apps = dflash_gpu.parse_apps(json.loads(line))
    trainers = [p["pid"] for p in dflash_procs.find_trainers(root)]
    print(json.dumps(dflash_gpu.view(apps, trainers)), flush=True)
for child in (job, stranger):
    child.kill()
    child.wait()
"""


def _nstgid(pid: str) -> list[int] | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NStgid:"):
                return [int(value) for value in line.split()[1:]]
    except (OSError, ValueError):
        return None
    return None


def _parent_ns(pid: str, unshare_pid: int) -> bool:
    """Whether the process descends from our unshare (other tests may make namespaces)."""
    while pid not in ("0", "1"):
        try:
            pid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            return False
        if int(pid) == unshare_pid:
            return True
    return False


def test_a_driver_that_gives_the_containers_pids_names_the_stranger_not_the_job(namespace):
    pids = namespace["inner"]
    csv = f"{pids['job']}, /usr/bin/sleep, 70000, {G0}\n{pids['stranger']}, sleep, 2048, {G0}\n"
    seen = namespace["ask"](csv)
    assert seen["in_init_pid_namespace"] is False
    assert seen["job"] == [{"pid": pids["job"], "ns": [pids["job"]]}]
    verdict = judge(probe(csv, seen), [0, 1], job_running=True)
    assert verdict["pids"] == "here" and verdict["crowded"] == []
    assert verdict["foreign"] == [{"pid": pids["stranger"], "gpu": 0, "used_mib": 2048,
                                   "command": "sleep 301", "visible": True}]  # fmt: skip


def test_a_driver_that_gives_the_nodes_pids_is_matched_by_count(namespace):
    # What the proprietary driver does in a container: every pid is the node's.
    outer = namespace["outer"]
    assert set(outer) == {"job", "stranger"}
    alone = namespace["ask"](f"{outer['job']}, python, 70000, {G0}\n")
    assert judge(probe(f"{outer['job']}, python, 70000, {G0}\n", alone), [0], True)[
        "foreign"] == []  # fmt: skip
    csv = f"{outer['job']}, python, 70000, {G0}\n{outer['stranger']}, [Not Found], 2048, {G0}\n"
    verdict = judge(probe(csv, namespace["ask"](csv)), [0, 1], job_running=True)
    assert verdict["pids"] == "node" and verdict["foreign"] == []
    [crowded] = verdict["crowded"]
    assert crowded["gpu"] == 0
    assert [(p["pid"], p["used_mib"]) for p in crowded["processes"]] == [
        (outer["job"], 70000), (outer["stranger"], 2048)
    ]  # fmt: skip
    # With no trainer running, whatever holds the job's GPU is foreign, named as listed.
    idle = judge(probe(csv, namespace["ask"](csv)), [0], job_running=False)
    assert [(f["pid"], f["command"], f["visible"]) for f in idle["foreign"]] == [
        (outer["job"], "python", False), (outer["stranger"], "[Not Found]", False)
    ]  # fmt: skip


def test_on_the_node_the_jobs_nested_pids_are_its_own(namespace):
    # A reader in the initial pid namespace (a host, or the node itself) sees the driver's
    # pids: the job's process is known by its NStgid's outer pid.
    assert in_init_pid_namespace(), "this test machine runs in the initial pid namespace"
    outer, inner = namespace["outer"], namespace["inner"]
    csv = f"{outer['job']}, python, 73500, {G0}\n{outer['stranger']}, sleep, 2048, {G1}\n"
    seen = view(parse_apps(csv), [outer["job"]])
    assert seen["job"] == [{"pid": outer["job"], "ns": [outer["job"], inner["job"]]}]
    facts = {
        "deployment": {"run_sh": {"layout": {"mode": "split", "target": [0], "drafter": [1]}}},
        "trainers": {"processes": [{"pid": outer["job"]}]},
        "gpu": probe(csv, seen),
    }
    [item] = gpu_findings(facts)
    assert (item["pid"], item["gpu"], item["used_mib"]) == (outer["stranger"], 1, 2048)
    assert item["found"] == f"pid {outer['stranger']} (sleep 301) holds 2048 MiB"
