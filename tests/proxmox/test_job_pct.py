"""One training job across the test bed's two containers over pct: torchrun's c10d rendezvous
on the first container, gloo between the containers (the bed's stand-in for vmbr0: they share
the node's network, tests/testbed/README.md). Deployed and verified as one job; one host's
trainer killed makes the job broken in verify, a redeploy brings it back; a release that fails
on one host puts the whole job back on the previous release; a container switched by hand is
named by the job's verdict."""

from __future__ import annotations

import json
import socket
import time

from tests.integration.conftest import IDLE_STEP_S, add_release

# Two ranks per container (a target and a drafter rank) on the CPU.
JOB_ARGS = {
    "target_model": "tiny", "gen_samples": 64, "cpu_ranks": True, "dist_timeout": 60,
    "max_seq_len": 64, "token_budget": 256, "num_anchors": 16, "drafter_layers": 2,
    "sleep_per_step": IDLE_STEP_S,  # four ranks training flat out would hold both cores
}  # fmt: skip
# v2 crashes at start where this file exists (one container only).
FAIL_MARK = "/etc/dflash-test-refuse-v2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_vars(bed) -> dict:
    port = free_port()  # the node's ports are the containers' (one network)
    return {
        vmid: {
            "dflash_job": "j1", "dflash_job_address": "127.0.0.1", "dflash_job_port": port,
            "dflash_target_gpus": [0], "dflash_drafter_gpus": [1], "dflash_trainer_args": JOB_ARGS,
            "dflash_trainer_env": {"GLOO_SOCKET_IFNAME": "lo"},
            "dflash_restart_policy": {"backoff": 2},
        }
        for vmid in bed.vmids
    }  # fmt: skip


def deployments(bed, vmid: int, root: str, action: str = "") -> list[dict]:
    """history.jsonl's lines in a container: the deployments, or the lines of one action."""
    lines = map(json.loads, bed.attach(vmid, "cat", f"{root}/history.jsonl").stdout.splitlines())
    if action:
        return [e for e in lines if e["action"] == action]
    return [e for e in lines if e["action"] != "restart"]


def kill_trainer(bed, vmid: int, root: str) -> None:
    """SIGKILL every process of the trainer in the container (torchrun's agent and workers)."""
    bed.attach(vmid, "pkill", "-9", "-f", f"{root}/", check=False)


def test_a_two_container_job_is_deployed_verified_and_recovered_as_one(
    bed, pct_playbook, trainer_repo
):
    first_ct, second_ct = bed.vmids
    first, second = bed.hostname(first_ct), bed.hostname(second_ct)
    per_host = job_vars(bed)
    common = {"dflash_source_dir": str(trainer_repo), "dflash_launch": True,
              "dflash_health_timeout": 180}  # fmt: skip
    root = pct_playbook.root
    try:
        deployed = pct_playbook("deploy.yml", host_vars=per_host, dflash_ref="v1", **common)
        assert deployed.rc == 0, deployed.output
        audit = pct_playbook("verify.yml", host_vars=per_host)
        assert audit.rc == 0, audit.output
        # The job's table, for the reader of the test log.
        print("\n".join(line for line in audit.output.splitlines() if "JOB j1" in line
                        or line.strip().startswith((first, second))))  # fmt: skip
        verdict = audit.report["jobs"]["j1"]
        assert verdict["verdict"] == "ok" and verdict["hosts"] == [first, second], verdict
        assert {n["live"]["world_size"] for n in verdict["nodes"].values()} == {4}
        assert sorted(n["live"]["node_rank"] for n in verdict["nodes"].values()) == [0, 1]

        # A crash of one container's ranks (its workers killed, its supervisor left): its
        # torchrun fails, the other container's ranks lose their peers and fail too; each
        # supervisor restarts its torchrun and the job forms again at its rendezvous.
        # (torchrun's workers only: the supervisor's and torchrun's command lines name
        # dflash.train too, but not after "python -u")
        bed.attach(second_ct, "pkill", "-9", "-f", "python -u -m dflash[.]train", check=False)
        for vmid in bed.vmids:
            deadline = time.monotonic() + 240
            while "restarted" not in [e["result"] for e in deployments(bed, vmid, root, "restart")]:
                assert time.monotonic() < deadline, f"no restart recorded in {vmid}"
                time.sleep(1)
        rejoined = pct_playbook("verify.yml", host_vars=per_host)
        assert rejoined.rc == 0, rejoined.output
        assert rejoined.report["jobs"]["j1"]["verdict"] == "ok"
        assert {n["live"]["world_size"] for n in rejoined.report["jobs"]["j1"]["nodes"].values()
                } == {4}  # fmt: skip
        for host in (first, second):
            assert rejoined.report["hosts"][host]["supervision"]["restarts"]["count"] >= 1

        kill_trainer(bed, second_ct, root)
        broken = pct_playbook("verify.yml", host_vars=per_host)
        assert broken.rc != 0
        verdict = broken.report["jobs"]["j1"]
        assert verdict["verdict"] == "broken", verdict
        assert (second, "job_trainer") in {(f["host"], f["kind"]) for f in verdict["findings"]}

        again = pct_playbook("deploy.yml", host_vars=per_host, dflash_ref="v1", **common)
        assert again.rc == 0, again.output
        for vmid in bed.vmids:  # the whole job started again, not only the killed host
            runs = [e["run_id"] for e in deployments(bed, vmid, root)]
            assert len(runs) == 2 and runs[0] != runs[1], runs

        # v2 crashes at start on the first container, which hosts the rendezvous: the second's
        # ranks lose it at once; both go back to v1 together.
        add_release(trainer_repo, "v2", "dflash/options.py",
                    f"\nimport os as _os\nif _os.path.exists({FAIL_MARK!r}):\n"
                    "    raise RuntimeError('v2 refuses this host')\n")  # fmt: skip
        bed.attach(first_ct, "touch", FAIL_MARK)
        failed = pct_playbook("deploy.yml", host_vars=per_host, dflash_ref="v2", **common)
        assert failed.rc != 0
        flat = " ".join(failed.output.split())
        assert f"Job j1: release v2 failed on {first}" in flat
        assert "Every host of the job went back" in flat
        for vmid in bed.vmids:
            lines = deployments(bed, vmid, root)
            results = [(e["action"], e["release"], e["result"]) for e in lines]
            assert results[-2:] == [("deploy", "v2", "rolled_back"), ("rollback", "v1", "healthy")]
        back = pct_playbook("verify.yml", host_vars=per_host)
        assert back.rc == 0, back.output
        assert back.report["jobs"]["j1"]["release"] == "v1"

        # A person switches the second container to v2 by hand (a rollback of one host).
        bed.attach(second_ct, "ln", "-sfn", "releases/v2", f"{root}/current")
        switched = pct_playbook("verify.yml", host_vars=per_host)
        assert switched.rc != 0
        verdict = switched.report["jobs"]["j1"]
        assert verdict["verdict"] != "ok", verdict
        assert (second, "job_release") in {(f["host"], f["kind"]) for f in verdict["findings"]}
    finally:
        bed.attach(first_ct, "rm", "-f", FAIL_MARK, check=False)
        stopped = pct_playbook("playbooks/stop.yml", host_vars=per_host, dflash_stop_timeout=20)
        assert stopped.rc == 0, stopped.output


def test_a_job_whose_hosts_disagree_or_whose_container_is_down_changes_nothing(
    bed, pct_playbook, trainer_repo
):
    first_ct, second_ct = bed.vmids
    first, second = bed.hostname(first_ct), bed.hostname(second_ct)
    per_host = job_vars(bed)
    common = {"dflash_source_dir": str(trainer_repo), "dflash_ref": "v1", "dflash_launch": True}
    root = pct_playbook.root

    def untouched() -> None:
        for vmid in bed.vmids:
            probe = bed.attach(vmid, "test", "-e", f"{root}/releases", check=False)
            assert probe.returncode != 0, f"CT {vmid} was changed"

    other = {**per_host, second_ct: {**per_host[second_ct], "dflash_target_gpus": [0, 2]}}
    refused = pct_playbook("deploy.yml", host_vars=other, **common)
    assert refused.rc != 0
    flat = " ".join(refused.output.split())
    assert f"job j1 ({first}, {second}) cannot be deployed as one" in flat
    assert '"target": [0, 2]' in flat
    untouched()

    # Its container stopped, the second host fails the Proxmox check; the first stops too.
    bed.stop_container(second_ct)
    try:
        down = pct_playbook("deploy.yml", host_vars=per_host, **common)
    finally:
        bed.start_container(second_ct)
    assert down.rc != 0
    assert down.recap[first]["failed"] == 1 and down.recap[second]["failed"] == 1
    flat = " ".join(down.output.split())
    assert f"Job j1: {second} failed or could not be reached" in flat
    untouched()
