"""A job's plan from its hosts' cards (filter_plugins/dflash_job.py) and its verdict in verify
(filter_plugins/dflash_job_verify.py), on plain data."""

from __future__ import annotations

from dflash_job_filters import job_plan
from dflash_job_verify_filters import job_verdicts

LAYOUT = {"mode": "split", "target": [0], "drafter": [1]}
CARD = {
    "name": "j1",
    "release": "v1",
    "tree_sha256": "t1",
    "layout": LAYOUT,
    "trainer_args": {},
    "trainer_env": {},
    "torchrun_args": [],
    "lock": {"torch": "2.13"},
    "port": 29400,
}
HOSTS = ["a", "b", "c"]


def hostvars(**cards: dict) -> dict:
    """a and b in job j1 with these cards (address = the host's name), c on its own."""
    out = {h: {"dflash_job": "j1", "dflash_job_card": {**CARD, "address": h, **cards.get(h, {})}}
           for h in ("a", "b")}  # fmt: skip
    out["c"] = {"dflash_job": ""}
    return out


def test_the_plan_puts_the_rendezvous_on_the_first_host_and_is_the_same_everywhere():
    plans = {h: job_plan(hostvars(), h, HOSTS, HOSTS) for h in ("a", "b")}
    assert plans["a"]["endpoint"] == plans["b"]["endpoint"] == "a:29400"
    assert plans["a"]["rdzv_id"] == plans["b"]["rdzv_id"]
    assert plans["a"]["rdzv_id"].startswith("j1-")
    assert (plans["a"]["is_host"], plans["b"]["is_host"]) == (True, False)
    assert plans["a"]["world_size"] == 4 and plans["a"]["hosts"] == ["a", "b"]
    assert job_plan(hostvars(), "c", HOSTS, HOSTS) == {}
    other = job_plan(hostvars(a={"release": "v2"}, b={"release": "v2"}), "a", HOSTS, HOSTS)
    assert other["rdzv_id"] != plans["a"]["rdzv_id"]  # another deployment, another id


def test_hosts_that_disagree_and_a_partial_run_are_named():
    plan = job_plan(hostvars(b={"layout": {**LAYOUT, "drafter": [1, 2]}, "address": ""}),
                    "a", HOSTS, HOSTS)  # fmt: skip
    assert "its hosts differ in the GPU layout" in plan["error"]
    assert '"drafter": [1, 2]' in plan["error"] and "no address for b" in plan["error"]
    partial = job_plan(hostvars(), "a", ["a"], HOSTS)
    assert "this run leaves out b" in partial["error"]
    own = job_plan(hostvars(a={"torchrun_args": ["--nnodes", "3"]}), "a", HOSTS, HOSTS)
    assert "the toolkit derives the rendezvous of a job" in own["error"]


def facts_of(release: str, rdzv: str) -> dict:
    job = {"name": "j1", "rdzv_id": rdzv, "world_size": 4}
    line = {"action": "deploy", "result": "healthy", "release": release, "run_sh": {"job": job}}
    return {"history": [line]}


def host_report(release: str, state: str | None, live: dict | None) -> dict:
    trainer = None if state is None else {"state": state, "job": live}
    return {"verdict": "ok", "release": release, "findings": [], "trainer": trainer}


def verdict(report: dict, facts: dict) -> dict:
    vars_ = {h: {"dflash_job": "j1", "dflash_verify_facts": facts[h]} for h in report}
    return job_verdicts(report, vars_, list(report))["j1"]


def test_the_job_verdict_ok_broken_and_a_host_switched_alone():
    live = {"rdzv_id": "j1-x", "world_size": 4, "lead": True, "node_rank": 0}
    facts = {"a": facts_of("v1", "j1-x"), "b": facts_of("v1", "j1-x")}
    good = {"a": host_report("v1", "running", live),
            "b": host_report("v1", "running", {**live, "lead": False, "node_rank": 1})}  # fmt: skip
    assert verdict(good, facts)["verdict"] == "ok"
    killed = dict(good, b=host_report("v1", None, None))
    found = verdict(killed, facts)
    assert found["verdict"] == "broken"
    assert [(f["kind"], f["host"]) for f in found["findings"]] == [("job_trainer", "b")]
    switched = dict(good, b=host_report("v2", "running", {**live, "lead": False}))
    assert ("job_release", "b") in {
        (f["kind"], f["host"]) for f in verdict(switched, facts)["findings"]
    }
    short = dict(good, a=host_report("v1", "running", {**live, "world_size": 2}))
    assert verdict(short, facts)["verdict"] == "broken"


def test_a_job_stop_yml_stopped_on_every_host_is_stopped_not_broken():
    facts = {"a": facts_of("v1", "j1-x"), "b": facts_of("v1", "j1-x")}
    stopped = {h: dict(host_report("v1", None, None), verdict="stopped") for h in facts}
    found = verdict(stopped, facts)
    assert (found["verdict"], found["findings"]) == ("stopped", [])
    # One host stopped on purpose while the other is gone: the job is broken, not stopped.
    half = dict(stopped, b=host_report("v1", None, None))
    assert verdict(half, facts)["verdict"] == "broken"
