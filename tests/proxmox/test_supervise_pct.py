"""Supervision inside a container over pct: the trainer killed (three times), hung (SIGSTOP)
and then failing at every start (its data store gone, as when a data volume is unmounted).
The supervisor restarts it from its checkpoint, dumps the hung trainer's stacks, gives up on
the crash loop; verify stays ok through the restarts, shows them with the goodput, and names
the crash loop. Run with -s to see verify's table after each (the note of issue 28 quotes it)."""

from __future__ import annotations

import json
import statistics
import textwrap
import time

from tests.integration.conftest import TRAINER_ARGS
from tests.proxmox.test_deploy_pct import sh

# Idle between steps (TRAINER_ARGS), so a checkpoint comes every 4 steps, not 10.
ARGS = {**TRAINER_ARGS, "checkpoint_every": 4}
POLICY = {"dflash_restart_policy": {"backoff": 1, "backoff_max": 4}, "dflash_hang_after": 15}
RECORDS = """python3 - <<'EOF'
import json, random
random.seed(1)
with open("{path}", "w") as out:
    for _ in range(200):
        ids = [random.randrange(127) for _ in range(48)]
        out.write(json.dumps({{"input_ids": ids, "loss_mask": [0] * 8 + [1] * 40}}) + "\\n")
EOF"""


def table(run) -> str:
    """verify's table of the host, as the play prints it."""
    text = run.output.split("Show the trainer, its tokens/s and the findings")[1]
    lines = text.split("TASK [")[0].splitlines()
    first = next(i for i, line in enumerate(lines) if "release: " in line)
    return textwrap.dedent("\n".join(lines[first:])).strip()


def test_crash_hang_and_crash_loop_in_a_container(bed, pct_playbook, trainer_repo):
    vmid = bed.vmids[0]
    host, root = bed.hostname(vmid), pct_playbook.root
    store = f"{root}-store"

    def status() -> dict:
        text = sh(bed, vmid, f"cat {root}/runs/latest/status.json 2>/dev/null")
        return json.loads(text) if text else {}

    def wait(what: str, predicate, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = status()
            if predicate(now):
                return now
            time.sleep(0.3)
        raise AssertionError(f"{what}: never; last status {now}")

    def saved(attempt: int):
        return lambda s: s.get("attempt") == attempt and (s.get("checkpoint") or {}).get("at")

    def stepping(attempt: int):
        return lambda s: s.get("attempt") == attempt and s.get("step", 0) > (
            s.get("resumed_from_step") or 0)  # fmt: skip

    def verify():
        run = pct_playbook("verify.yml", dflash_hosts=host)
        print(f"\n--- verify.yml on {host} ---\n{table(run)}")
        return run

    common = {"dflash_source_dir": str(trainer_repo), "dflash_ref": "v1", "dflash_hosts": host}
    staged = pct_playbook("deploy.yml", **common)  # the release and env, to prepare the data
    assert staged.rc == 0, staged.output
    sh(bed, vmid, RECORDS.format(path=f"{root}-records.jsonl"))
    python = sh(bed, vmid, f"ls -d {root}/envs/*/bin/python")
    prepared = bed.attach(vmid, "sh", "-c", f"cd {root}/current && {python} -m dflash.data "
                          f"prepare --out {store} --target-model tiny {root}-records.jsonl",
                          check=False)  # fmt: skip
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    try:
        run = pct_playbook(
            "deploy.yml", dflash_launch=True, dflash_trainer_args=ARGS, dflash_data=store,
            dflash_health_timeout=240, **POLICY, **common,
        )  # fmt: skip
        assert run.rc == 0, run.output

        # Three kills, each after a checkpoint: back each time, resumed, the same deployment.
        seconds = []
        for attempt in (1, 2, 3):
            before = wait("a checkpoint", saved(attempt - 1))
            killed = time.monotonic()
            sh(bed, vmid, f"kill -9 {before['pid']}")
            back = wait("the restarted trainer", stepping(attempt))
            seconds.append(time.monotonic() - killed)
            assert back["resumed_from_step"] > 0 and back["run_id"] == before["run_id"]
        print(
            f"\nkill -9 to the first step after it, {host}: {[round(s, 1) for s in seconds]} s, "
            f"median {statistics.median(seconds):.1f} s (back-off 1, 2, 4 s)"
        )
        audit = verify()
        assert audit.rc == 0 and audit.report["hosts"][host]["verdict"] == "ok", audit.output
        supervision = audit.report["hosts"][host]["supervision"]
        assert supervision["restarts"]["count"] == 3
        assert supervision["restarts"]["last_reason"] == "signal SIGKILL"

        # A hang: stopped, so alive but without steps; dumped and restarted after 15 s.
        sh(bed, vmid, f"kill -STOP {back['pid']}")
        wait("the trainer after the hang", stepping(4))
        log = sh(bed, vmid, f"cat {root}/runs/latest/train.log")
        assert "supervisor: hung: no step for" in log and "dflash/train.py" in log
        audit = verify()
        assert audit.rc == 0, audit.output
        assert audit.report["hosts"][host]["supervision"]["restarts"]["last_reason"] == "hung"

        # The data store gone: every start fails; past 5 restarts in the window it gives up.
        sh(bed, vmid, f"mv {store} {store}.gone && kill -9 {status()['pid']}")
        deadline = time.monotonic() + 240
        while '"crash_loop"' not in sh(bed, vmid, f"cat {root}/runs/latest/supervisor.json"):
            assert time.monotonic() < deadline, "no crash loop"
            time.sleep(1)
        audit = verify()
        assert audit.rc != 0
        [item] = [f for f in audit.report["hosts"][host]["findings"] if f["kind"] == "crash_loop"]
        assert f"--data '{store}'" in item["found"], item
        lines = [json.loads(x) for x in sh(bed, vmid, f"cat {root}/history.jsonl").splitlines()]
        restarts = [x for x in lines if x["action"] == "restart"]
        assert [x["result"] for x in restarts][:4] == ["restarted"] * 4
        assert restarts[-1]["result"] == "crash_loop"
    finally:
        stop = pct_playbook("playbooks/stop.yml", dflash_hosts=host)
        assert stop.rc == 0, stop.output
        sh(bed, vmid, f"rm -rf {store} {store}.gone {root}-records.jsonl")
