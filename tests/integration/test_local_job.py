"""A job over two hosts on the local target (two state roots, one machine: torchrun's c10d
rendezvous and gloo over loopback): deployed, verified and rolled back as one; hosts that
disagree, or one that cannot be reached, stop the whole job before anything changes. The
same job over pct between two containers is tests/proxmox/test_job_pct.py."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import yaml

from tests.helpers import local_inventory, run_playbook, seed_target
from tests.integration.conftest import IDLE_STEP_S, add_release, read_json

# Two ranks per host (a target and a drafter rank) on the CPU, small enough for a 2-core box.
JOB_ARGS = {
    "target_model": "tiny", "gen_samples": 64, "cpu_ranks": True, "dist_timeout": 60,
    "max_seq_len": 64, "token_budget": 256, "num_anchors": 16, "drafter_layers": 2,
    "sleep_per_step": IDLE_STEP_S,  # four ranks training flat out would hold both cores
}  # fmt: skip
HOSTS = ("n1", "n2")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_inventory(tmp_path: Path, envs: Path | None = None, **per_host: dict) -> Path:
    """inventory/local.yml's host twice, as the two hosts of job j1, each with its own root
    (seeded with the run's torch env when `envs` is given: the refusals need no env)."""
    inventory = local_inventory()
    hosts = inventory["all"]["children"]["dflash_targets"]["hosts"]
    base = hosts.pop("local")
    port = free_port()
    for name in HOSTS:
        if envs is not None and not (tmp_path / name).exists():
            seed_target(tmp_path / name, envs)
        (tmp_path / name).mkdir(exist_ok=True)
        hosts[name] = {
            **base, "dflash_root": str(tmp_path / name), "dflash_job": "j1",
            "dflash_job_port": port, "dflash_target_gpus": [0], "dflash_drafter_gpus": [1],
            "dflash_trainer_args": JOB_ARGS, "dflash_trainer_env": {"GLOO_SOCKET_IFNAME": "lo"},
            "dflash_min_throughput_ratio": 0, "dflash_verify_min_throughput_ratio": 0,
            "dflash_verify_max_cpu_wait": 1,
            "dflash_restart_policy": {"backoff": 2},
            **per_host.get(name, {}),
        }  # fmt: skip
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def run(tmp_path: Path, name: str, inventory: Path, **extravars: object):
    extravars.setdefault("dflash_verify_json", str(tmp_path / "verify.json"))
    return run_playbook(name, extravars, inventory=inventory)


def wait_for_status(root: Path, predicate, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = read_json(root / "runs" / "latest" / "status.json") or {}
        if status and predicate(status):
            return status
        time.sleep(0.5)
    raise AssertionError(f"{root}: status.json never matched; last: {status}")


def history(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def test_a_job_is_deployed_verified_and_rolled_back_as_one(tmp_path, trainer_repo, local_envs):
    add_release(trainer_repo, "v2", "dflash/__init__.py", "\n# v2\n")
    inventory = job_inventory(tmp_path, local_envs)
    source = {"dflash_source_dir": str(trainer_repo), "dflash_health_timeout": 240}
    try:
        first = run(tmp_path, "deploy.yml", inventory, dflash_ref="v1", **source)
        assert first.rc == 0, first.output
        second = run(tmp_path, "deploy.yml", inventory, dflash_ref="v2", **source)
        assert second.rc == 0, second.output
        v2 = {h: history(tmp_path / h)[-1] for h in HOSTS}
        jobs = {h: line["run_sh"]["job"] for h, line in v2.items()}
        assert {j["rdzv_id"] for j in jobs.values()} == {jobs["n1"]["rdzv_id"]}
        assert jobs["n1"]["hosts"] == list(HOSTS) and jobs["n1"]["world_size"] == 4
        assert [j["is_host"] for j in jobs.values()] == [True, False]  # n1 is first

        audit = run(tmp_path, "verify.yml", inventory)
        assert audit.rc == 0, audit.output
        job = json.loads((tmp_path / "verify.json").read_text())["jobs"]["j1"]
        assert job["verdict"] == "ok" and job["release"] == "v2", job
        assert [n["live"]["world_size"] for n in job["nodes"].values()] == [4, 4]
        assert "JOB j1: ok (2 hosts, release v2" in audit.output

        # A crash on one host (n2's lead rank killed): n2's torchrun fails, n1's ranks lose
        # their peer and fail too; each host's supervisor restarts its torchrun and the two
        # meet again at the job's rendezvous, from the checkpoint, and both record it.
        os.kill(read_json(tmp_path / "n2" / "runs" / "latest" / "status.json")["pid"], 9)

        def rejoined(status: dict) -> bool:
            whole = (status.get("job") or {}).get("world_size") == 4
            return status.get("attempt", 0) >= 1 and status["state"] == "running" and whole

        for host in HOSTS:
            status = wait_for_status(tmp_path / host, rejoined)
            assert status["job"]["rdzv_id"] == jobs["n1"]["rdzv_id"]
        for host in HOSTS:
            deadline = time.monotonic() + 60
            while not [x for x in history(tmp_path / host) if x["action"] == "restart"]:
                assert time.monotonic() < deadline, f"no restart line on {host}"
                time.sleep(0.5)
        audit = run(tmp_path, "verify.yml", inventory)
        assert audit.rc == 0, audit.output
        assert "restarts: " in audit.output

        # A rollback of part of a job is refused, naming the host left out.
        partial = run(tmp_path, "rollback.yml", inventory, dflash_hosts="n1")
        assert partial.rc != 0
        assert "job j1 spans n1, n2, but this run leaves out n2" in " ".join(partial.output.split())
        deployments = [x for x in history(tmp_path / "n1") if x["action"] != "restart"]
        assert deployments[-1] == v2["n1"]

        back = run(tmp_path, "rollback.yml", inventory, **source)
        assert back.rc == 0, back.output
        for host in HOSTS:
            line = history(tmp_path / host)[-1]
            outcome = (line["action"], line["release"], line["result"])
            assert outcome == ("rollback", "v1", "healthy")
            status = read_json(tmp_path / host / "runs" / "latest" / "status.json")
            assert status["release"] == "v1" and status["job"]["world_size"] == 4
        v1_ids = {history(tmp_path / h)[0]["run_sh"]["job"]["rdzv_id"] for h in HOSTS}
        live_ids = {
            read_json(tmp_path / h / "runs" / "latest" / "status.json")["job"]["rdzv_id"]
            for h in HOSTS
        }
        assert live_ids == v1_ids and len(v1_ids) == 1  # v1's own rendezvous, on both
        audit = run(tmp_path, "verify.yml", inventory)
        assert audit.rc == 0, audit.output
    finally:
        stop = run(tmp_path, "playbooks/stop.yml", inventory, dflash_stop_timeout=20)
        assert stop.rc == 0, stop.output


def test_hosts_of_a_job_with_different_gpu_layouts_are_refused_before_any_change(
    tmp_path, trainer_repo
):
    inventory = job_inventory(tmp_path, n2={"dflash_drafter_gpus": [1, 2]})
    result = run(tmp_path, "deploy.yml", inventory, dflash_source_dir=str(trainer_repo))
    assert result.rc != 0
    assert result.recap["n1"]["failed"] == 1 and result.recap["n2"]["failed"] == 1
    flat = " ".join(result.output.split())
    assert "job j1 (n1, n2) cannot be deployed as one: its hosts differ in the GPU layout" in flat
    assert '"drafter": [1, 2]' in flat and "Nothing was changed on any host of the job" in flat
    for host in HOSTS:
        assert not (tmp_path / host / "releases").exists(), host
        assert not (tmp_path / host / "history.jsonl").exists(), host


def test_an_unreachable_host_stops_its_job_before_any_change(tmp_path, trainer_repo):
    gone = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": free_port(),
            "dflash_job_address": "127.0.0.1"}  # fmt: skip
    inventory = job_inventory(tmp_path, n2=gone)
    result = run(tmp_path, "deploy.yml", inventory, dflash_source_dir=str(trainer_repo))
    assert result.rc != 0
    assert result.recap["n2"]["unreachable"] == 1 and result.recap["n1"]["failed"] == 1
    flat = " ".join(result.output.split())
    assert "Job j1: n2 failed or could not be reached (the checks before any change" in flat
    assert "nothing was changed on any host of the job" in flat
    assert not (tmp_path / "n1" / "releases").exists()
    assert not (tmp_path / "n1" / "current").exists()


def test_hosts_of_a_job_that_name_different_data_are_refused_before_any_change(
    tmp_path, trainer_repo
):
    """Each host names its own store; two stores of other content are two data sets."""
    from dflash.data.prepare import prepare
    from dflash.data.records import Settings

    stores = {}
    for number, host in enumerate(HOSTS):
        jsonl = tmp_path / f"{host}.jsonl"
        jsonl.write_text(json.dumps({"input_ids": [number + 1] * 12}) + "\n")
        stores[host] = prepare([jsonl], tmp_path / f"store-{host}", Settings(64, 128, None),
                               say=print)  # fmt: skip
    per_host = {h: {"dflash_data": str(tmp_path / f"store-{h}")} for h in HOSTS}
    inventory = job_inventory(tmp_path, **per_host)
    result = run(tmp_path, "deploy.yml", inventory, dflash_source_dir=str(trainer_repo))
    assert result.rc != 0
    flat = " ".join(result.output.split())
    assert "its hosts differ in the training data (dflash_data" in flat
    for host in HOSTS:
        assert f'"store {stores[host]["content_sha256"]}"' in flat
        assert not (tmp_path / host / "releases").exists(), host
