"""One training job over two nodes: two torchrun agents meeting in a c10d rendezvous on
loopback, each with its own checkpoint folder and status.json, as two containers of a job run.

The job trains what one node with the same ranks trains (same losses); every node's status.json
names the job (rendezvous id, node rank, world size); a stopped job resumes from the newest
checkpoint of any node, also when the rendezvous makes another node the lead. (A node killed
outright fails the others: tests/proxmox/test_job_pct.py, between two containers.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import cli_env, log_losses, read_status, wait_for_status
from .test_multiprocess import SHAPE, argv, children, files, finish, torchrun

# Not in `make test-quick`: two torchrun agents and their ranks.
pytestmark = pytest.mark.slow

SPLIT_NODE = argv("--target-gpus 0 --drafter-gpus 1")  # per node: a target and a drafter rank
STEPS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_command(port: int, job: str, host: bool, *args: str, per_node: int = 2) -> list[str]:
    rendezvous = [
        "--nnodes", "2", "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job,
        "--rdzv-conf", f"is_host={int(host)}", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous, "-m", "dflash.train",
            *args]  # fmt: skip


def start_node(command: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = dict(cli_env(), GLOO_SOCKET_IFNAME="lo")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    return subprocess.Popen(command, cwd=cwd, env=env, **pipes)


def start_job(
    tmp_path: Path, job: str, first: str, *args: str, layout: list[str] = SPLIT_NODE
) -> dict[str, subprocess.Popen]:
    """Nodes "a" and "b" (folders of the same names), `first` started first; the one hosting
    the rendezvous store is "a". `layout`: the GPU lists of each node."""
    port = free_port()
    per_node = len(set(layout[1].split(",")) | set(layout[3].split(",")))
    nodes = {}
    for name in (first, "b" if first == "a" else "a"):
        command = node_command(port, job, name == "a", *SHAPE, *layout, *args,
                               *files(tmp_path, name), per_node=per_node)  # fmt: skip
        nodes[name] = start_node(command, tmp_path)
        time.sleep(0.5)  # the first one joins first (the rendezvous sorts nodes by pid here)
    return nodes


def stop_job(nodes: dict[str, subprocess.Popen]) -> dict[str, str]:
    for process in nodes.values():  # what torchrun does with a SIGTERM of its own
        for pid in children(process.pid):
            os.kill(pid, signal.SIGTERM)
    return {name: finish(process) for name, process in nodes.items()}


def kill_node(process: subprocess.Popen) -> None:
    """SIGKILL a node's agent and its workers (torchrun starts each worker in a session of its
    own: killing the agent's process group alone leaves them running)."""
    for pid in [*children(process.pid), process.pid] if process.poll() is None else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def kill_job(nodes: dict[str, subprocess.Popen]) -> None:
    for process in nodes.values():
        kill_node(process)


def finish_job(nodes: dict[str, subprocess.Popen], timeout: float = 180) -> dict[str, str]:
    """Every node's output once it exits; whatever is left is killed, also on a timeout."""
    try:
        return {name: finish(process, timeout) for name, process in nodes.items()}
    finally:
        kill_job(nodes)


def test_a_job_over_two_nodes_trains_as_one_node_and_resumes_from_any_node(tmp_path):
    steps = ["--max-steps", str(STEPS)]
    # The same four ranks on one node: two targets feeding two drafters.
    one_node = [*SHAPE, *argv("--target-gpus 0,1 --drafter-gpus 2,3"), *steps]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    command = torchrun(4, *one_node, *files(tmp_path, "one"))
    reference = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), **pipes)
    nodes = start_job(tmp_path, "job-1", "a", *steps, "--sleep-per-step", "1.0")
    try:
        statuses = {
            name: wait_for_status(tmp_path / name / "status.json",
                                  lambda s: s["state"] == "running" and s["step"] >= 2, 180)
            for name in nodes
        }  # fmt: skip
        logs = stop_job(nodes)
    finally:
        kill_job(nodes)
    for status in statuses.values():
        job = status["job"]
        assert job["rdzv_id"] == "job-1" and job["nnodes"] == 2, status
        assert job["world_size"] == 4, status  # the lead sees both nodes' ranks
    assert sorted(s["job"]["node_rank"] for s in statuses.values()) == [0, 1]
    assert [s["job"]["lead"] for s in statuses.values()].count(True) == 1
    lead = next(name for name, s in statuses.items() if s["job"]["lead"])
    for name, process in nodes.items():
        assert process.returncode == 0, logs[name]
    stopped = {name: read_status(tmp_path / name / "status.json") for name in nodes}
    assert {s["state"] for s in stopped.values()} == {"stopped"}, stopped
    stop_step = stopped[lead]["step"]
    assert 2 <= stop_step < STEPS and stopped[lead]["checkpoint"]["step"] == stop_step
    other = "b" if lead == "a" else "a"
    assert not list((tmp_path / other / "ck").glob("step-*.pt"))  # only the lead saves

    # The node without the checkpoint starts first now, so it is likely the new lead: the
    # checkpoint still comes from the node that holds it, to every drafter rank.
    resumed = start_job(tmp_path, "job-2", other, *steps)
    logs2 = finish_job(resumed)
    for name, process in resumed.items():
        assert process.returncode == 0, logs2[name]
        status = read_status(tmp_path / name / "status.json")
        assert status["state"] == "stopped" and status["step"] == STEPS, status
        assert status["resumed_from_step"] == stop_step, status
        assert status["job"]["rdzv_id"] == "job-2"
    reference_log = finish(reference, 180)
    assert reference.returncode == 0, reference_log
    job_losses = {**log_losses(logs[lead]), **log_losses("".join(logs2.values()))}
    assert sorted(job_losses) == list(range(1, STEPS + 1))
    assert job_losses == log_losses(reference_log)


def test_a_colocated_job_over_two_nodes_runs_a_rank_on_each(tmp_path):
    nodes = start_job(tmp_path, "job-c", "a", "--max-steps", "4",
                      layout=argv("--target-gpus 0 --drafter-gpus 0"))  # fmt: skip
    logs = finish_job(nodes)
    for name, process in nodes.items():
        assert process.returncode == 0, logs[name]
        status = read_status(tmp_path / name / "status.json")
        assert status["state"] == "stopped" and status["step"] == 4, status
        assert status["job"]["world_size"] == 2 and status["job"]["rdzv_id"] == "job-c"
    assert "ranks: 2 (0: target+drafter cpu, 1: target+drafter cpu)" in "".join(logs.values())
