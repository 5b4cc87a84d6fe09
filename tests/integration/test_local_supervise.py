"""Supervision on the local target, deployed by deploy.yml with the real CPU trainer: a kill -9
and a hang (SIGSTOP) are recovered by the supervisor alone, recorded in history, shown by
verify (still ok), history.yml and the metrics; stop.yml and a deploy during a back-off win."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import TRAINER_ARGS, alive, read_json, status_of


def wait_for(what: str, predicate, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


def restart_lines(root: Path) -> list[dict]:
    lines = [json.loads(x) for x in (root / "history.jsonl").read_text().splitlines()]
    return [x for x in lines if x.get("action") == "restart"]


def supervisor_of(root: Path) -> dict:
    run_id = read_json(root / "trainer.json")["run_id"]
    return read_json(root / "runs" / run_id / "supervisor.json") or {}


def back_after(root: Path, attempt: int):
    """The status of attempt `attempt` once it has made a step of its own."""

    def check():
        status = status_of(root)
        done = status.get("step", 0) > (status.get("resumed_from_step") or 0)
        return status if status.get("attempt") == attempt and done else None

    return check


def metrics(tmp_path: Path) -> dict:
    prom = (tmp_path / "reports" / "verify.prom").read_text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(prom)
        for s in family.samples
    }


def test_crash_and_hang_come_back_by_themselves_and_stop_wins(
    deploy, playbook, target_root, tmp_path
):
    policy = {"dflash_restart_policy": {"backoff": 1}, "dflash_hang_after": 15,
              "dflash_trainer_args": {**TRAINER_ARGS, "checkpoint_every": 10}}  # fmt: skip
    assert deploy("v1", **policy).rc == 0
    record = read_json(target_root / "trainer.json")
    first = wait_for("a checkpoint", lambda: (status_of(target_root).get("checkpoint") or {}).get(
        "step") and status_of(target_root))  # fmt: skip

    # kill -9 of the trainer: back from its checkpoint within the back-off and its start-up.
    killed_at = time.monotonic()
    os.kill(first["pid"], signal.SIGKILL)
    back = wait_for("restarted trainer", back_after(target_root, 1))
    print(f"kill -9 to the first step after it: {time.monotonic() - killed_at:.1f} s")
    assert back["pid"] != first["pid"] and back["run_id"] == record["run_id"]
    assert back["resumed_from_step"] > 0 and back["code_tree_sha256"] == first["code_tree_sha256"]
    [line] = wait_for("restart line", lambda: restart_lines(target_root))
    assert (line["result"], line["reason"]) == ("restarted", "signal SIGKILL")
    assert line["release"] == "v1"
    assert read_json(target_root / "trainer.json") == record  # the same deployment

    verify = playbook("verify.yml")
    assert verify.rc == 0, verify.output
    host = verify.report["hosts"]["local"]
    assert host["verdict"] == "ok" and host["supervision"]["restarts"]["count"] == 1
    flat = " ".join(verify.output.split())
    assert "restarts: 1 (last: signal SIGKILL at" in flat and "goodput " in flat, verify.output
    values = metrics(tmp_path)
    assert values[("dflash_trainer_restarts", (("host", "local"),))] == 1
    good = host["supervision"]["goodput"]
    assert values[("dflash_goodput_ratio", (("host", "local"),))] == good["ratio"]
    badput = {c: values[("dflash_badput_seconds", (("cause", c), ("host", "local")))]
              for c in good["badput_s"]}  # fmt: skip
    assert badput == good["badput_s"] and badput["down"] >= 1
    listed = playbook("history.yml")
    assert listed.rc == 0 and "restart" in listed.output and "restarted" in listed.output

    # A hang: the trainer stopped (alive, no step); dumped and restarted after 15 s.
    os.kill(back["pid"], signal.SIGSTOP)
    wait_for("hang restart", back_after(target_root, 2), timeout=240)
    # (the supervisor writes the line once it has seen that first step)
    wait_for("hang line", lambda: len(restart_lines(target_root)) == 2, timeout=30)
    assert [x["reason"] for x in restart_lines(target_root)] == ["signal SIGKILL", "hung"]
    log = (target_root / "runs" / record["run_id"] / "train.log").read_text()
    hang = log[log.find("supervisor: hung: no step for") :]
    assert "supervisor: hung: no step for" in log and "dflash/train.py" in hang, log[-6000:]

    # stop.yml: supervisor and trainer gone, and nothing comes back.
    stop = playbook("playbooks/stop.yml")
    assert stop.rc == 0, stop.output
    time.sleep(3)
    assert not alive(record["pid"]) and not alive(status_of(target_root)["pid"])
    assert supervisor_of(target_root)["state"] == "stopped"
    assert len(restart_lines(target_root)) == 2


def test_a_deploy_during_a_back_off_wins(deploy, playbook, target_root):
    assert deploy("v1", dflash_restart_policy={"backoff": 3600, "backoff_max": 3600}).rc == 0
    record = read_json(target_root / "trainer.json")
    os.kill(status_of(target_root)["pid"], signal.SIGKILL)
    wait_for("back-off", lambda: supervisor_of(target_root).get("state") == "backoff", 60)
    # Down while the supervisor waits: verify says so (not OK), with when it comes back.
    down = playbook("verify.yml")
    assert down.rc != 0, down.output
    [item] = [f for f in down.report["hosts"]["local"]["findings"] if f["kind"] == "trainer_down"]
    assert "signal SIGKILL" in item["found"] and "the next start in" in item["found"], item
    # The deploy finds the trainer failed, stops its supervisor and starts a new run.
    run = deploy("v1", dflash_restart_policy={"backoff": 120})
    assert run.rc == 0, run.output
    new = read_json(target_root / "trainer.json")
    assert new["run_id"] != record["run_id"] and not alive(record["pid"])
    old = read_json(target_root / "runs" / record["run_id"] / "supervisor.json")
    assert old["state"] == "stopped" and old["restarts"]["count"] == 0
    assert restart_lines(target_root) == []


def test_a_trainer_whose_supervisor_died_is_named_and_its_hint_puts_it_back(
    deploy, playbook, target_root
):
    """The supervisor killed alone (as a full disk once killed it): its trainer trains on with
    nothing to restart it. verify names it; the hint, run as printed, puts the run back."""
    assert deploy("v1").rc == 0
    record = read_json(target_root / "trainer.json")
    trainer = status_of(target_root)["pid"]
    assert trainer != record["pid"]  # run.sh's process is the supervisor; the trainer its child
    os.kill(record["pid"], signal.SIGKILL)
    wait_for("the supervisor's end", lambda: not alive(record["pid"]), 30)
    assert alive(trainer)
    found = playbook("verify.yml")
    assert found.rc != 0, found.output
    [item] = [f for f in found.report["hosts"]["local"]["findings"]
              if f["kind"] == "supervisor_gone"]  # fmt: skip
    assert (
        f"the supervisor (pid {record['pid']}) is gone and the trainer (pid {trainer})"
        in (item["found"])
    )
    # trainer.json lost too (the soak's order of faults): the trainer is still tied to its run
    # through the run folder's copy, and the dead supervisor still named (not `OK: no drift`).
    (target_root / "trainer.json").unlink()
    lost = playbook("verify.yml")
    assert {f["kind"] for f in lost.report["hosts"]["local"]["findings"]} == {
        "supervisor_gone", "trainer_record"}, lost.output  # fmt: skip
    hint = item["hint"].split(", ansible-playbook ", 1)[1]  # ansible-playbook rollback.yml ...
    name, *args = hint.split()
    extra = {k: {"true": True}.get(v, v) for k, v in (a.split("=", 1) for a in args if a != "-e")}
    # (the playbook fixture stages by default; the user's inventory launches, as deploy did)
    again = playbook(name, dflash_launch=True, **extra)
    assert again.rc == 0, again.output
    assert not alive(trainer), again.output
    assert playbook("verify.yml").rc == 0
