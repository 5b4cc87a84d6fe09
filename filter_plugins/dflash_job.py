# A job: the hosts of one inventory value of dflash_job, trained as one torchrun job (c10d
# rendezvous). These filters turn every host's own "card" (what it would deploy) into the
# job's plan, refusing hosts that disagree before anything changes, and judge a job in verify.
from __future__ import annotations

import hashlib
import json
from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_job import job_members

# What every host of a job must deploy alike (the card's keys), and how a message names it.
SAME = {
    "release": "the release (dflash_ref)",
    "tree_sha256": "the release's code tree",
    "layout": "the GPU layout (dflash_target_gpus, dflash_drafter_gpus, dflash_colocated)",
    "trainer_args": "dflash_trainer_args",
    "trainer_env": "dflash_trainer_env",
    "torchrun_args": "dflash_torchrun_args",
    "data": "the training data (dflash_data: a store's content hash, a file's name and size)",
    "lock": "the environment lock's pins (dflash_env_lock, its source aside)",
    "port": "dflash_job_port",
    "rdzv_id": "the recorded rendezvous id (the deployment to roll back to)",
}
# torchrun flags the toolkit derives for a job; a user's own would contradict them.
DERIVED_FLAGS = ("--nnodes", "--node-rank", "--node_rank", "--rdzv", "--master", "--standalone",
                 "--local-addr", "--local_addr")  # fmt: skip


def _card(hostvars: Any, host: str) -> dict:
    card = hostvars[host].get("dflash_job_card")
    return dict(card) if card else {}


def job_plan(hostvars: Any, host: str, play_hosts: list[str], inventory_hosts: list[str]) -> dict:
    """This host's part of its job: the members, the rendezvous and its own address; {} for a
    host on its own; {"error": ...} naming every disagreement, its hosts and their values."""
    mine = _card(hostvars, host)
    name = mine.get("name") or ""
    if not name:
        return {}
    members = job_members(hostvars, name, inventory_hosts)
    left_out = [h for h in members if h not in play_hosts]
    if left_out:
        error = (
            f"job {name} spans {', '.join(members)}, but this run leaves out "
            f"{', '.join(left_out)} (a --limit or dflash_hosts): a job is deployed and rolled "
            "back as a whole; run it for every host of the job. Nothing was changed."
        )
        return {"error": error}
    cards = {h: _card(hostvars, h) for h in members}
    if not all(cards.values()):  # a host failed before its card: the barrier next names it
        return {"name": name, "hosts": members}
    problems = []
    layout = mine.get("layout") or {}
    if not (layout.get("target") or layout.get("drafter")):
        problems.append(
            "a job runs torchrun on every host: set dflash_target_gpus and dflash_drafter_gpus "
            "(add cpu_ranks: true to dflash_trainer_args to run those ranks on the CPU)"
        )
    for key, what in SAME.items():
        values = {h: card.get(key) for h, card in cards.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            listed = "; ".join(f"{h}: {json.dumps(v, sort_keys=True)}" for h, v in values.items())
            problems.append(f"its hosts differ in {what} ({listed})")
    own = [str(w) for w in mine.get("torchrun_args") or [] if str(w).startswith(DERIVED_FLAGS)]
    if own:
        problems.append(
            f"dflash_torchrun_args {own}: the toolkit derives the rendezvous of a job; leave "
            "these out"
        )
    missing = [h for h, card in cards.items() if not card.get("address")]
    if missing:
        problems.append(
            f"no address for {', '.join(missing)}: set dflash_job_address to the address the "
            "other hosts of the job reach it at (a pct connection's ansible_host is the "
            "Proxmox node, not the container)"
        )
    if problems:
        error = f"job {name} ({', '.join(members)}) cannot be deployed as one: " + "; ".join(
            problems
        )
        return {"error": error + ". Nothing was changed on any host of the job."}
    first = cards[members[0]]
    per_node = len(set(layout.get("target", [])) | set(layout.get("drafter", [])))
    seed = json.dumps([name, members, {k: mine.get(k) for k in SAME}], sort_keys=True)
    digest = hashlib.sha256(seed.encode()).hexdigest()[:12]
    return {
        "name": name,
        "hosts": members,
        "nnodes": len(members),
        "world_size": len(members) * per_node,
        # The same deployment of the same hosts gives the same id (run.sh stays the same, a
        # redeploy changes nothing); another one gives another, so no old node can join it.
        "rdzv_id": mine.get("rdzv_id") or f"{name}-{digest}",
        "endpoint": f"{first['address']}:{first['port']}",
        "address": mine["address"],
        "is_host": host == members[0],
    }


def job_out(plan: dict, play_hosts: list[str]) -> list[str]:
    """The job's hosts that are no longer in the play (failed or unreachable)."""
    return [h for h in (plan or {}).get("hosts", []) if h not in play_hosts]


def job_restarts(plan: dict, hostvars: Any, play_hosts: list[str], fact: str) -> list[str]:
    """The job's hosts whose check-mode launch (`fact`) would start or restart a trainer (a
    trainer only waiting to be recorded is no reason); one is reason enough for all."""
    found = []
    for host in (plan or {}).get("hosts", []):
        result = hostvars[host].get(fact) if host in play_hosts else None
        if result and result.get("changed") and not result.get("adopted"):
            found.append(f"{host}: {result.get('msg')}")
    return found


def job_failures(plan: dict, hostvars: Any, play_hosts: list[str], fact: str) -> list[str]:
    """The job's hosts whose launch failed (`fact` set by its rescue) or that left the play."""
    found = []
    for host in (plan or {}).get("hosts", []):
        gone = {"msg": "failed or unreachable"}
        failed = hostvars[host].get(fact) if host in play_hosts else gone
        if failed:
            found.append(f"{host} ({(failed.get('msg') or 'failed').splitlines()[0][:300]})")
    return found


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_job_plan": job_plan,
            "dflash_job_out": job_out,
            "dflash_job_restarts": job_restarts,
            "dflash_job_failures": job_failures,
        }
