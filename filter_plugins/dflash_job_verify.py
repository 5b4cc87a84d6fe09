# verify.yml's verdict per job (dflash_job): on top of each host's own verdict, whether the
# job's hosts train as one (all read, one release, one rendezvous, the deployed world size).
from __future__ import annotations

from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_job import job_members
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import last_deployment
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is

BROKEN = ("job_host", "job_trainer", "job_rendezvous", "job_world_size")


def _deployed(facts: dict) -> tuple[dict, str | None]:
    """The job ({} when on its own) and release of the newest deployment line in history."""
    entry = last_deployment(facts.get("history") or []) or {}
    return (entry.get("run_sh") or {}).get("job") or {}, entry.get("release")


def _most_common(values: list[Any]) -> Any:
    """The most common value; on a tie the first host's (inventory order)."""
    return max(values, key=lambda v: (values.count(v), -values.index(v)), default=None)


def _finding(kind: str, host: str, expected: Any, found: Any, hint: str) -> dict:
    return {"kind": kind, "host": host, "expected": expected, "found": found, "hint": hint}


def _judge_job(name: str, members: list[str], report: dict, hostvars: Any) -> dict:
    """One job's verdict: every host read, each one's trainer in the deployed rendezvous, the
    same release and rendezvous on all, the world size the deployment had; per-host drift too."""
    findings: list[dict] = []
    hosts: dict[str, dict] = {}
    redeploy = f"ansible-playbook deploy.yml (all hosts of job {name})"
    for host in members:
        result = report.get(host)
        if result is None or result.get("verdict") == "unreachable":
            why = "not in this audit" if result is None else "could not be read"
            findings.append(_finding("job_host", host, "read", why, f"check {host}, then verify"))
            continue
        facts = hostvars[host].get("dflash_verify_facts") or {}
        job = ((result.get("trainer") or {}).get("job")) or {}
        deployed, deployed_release = _deployed(facts)
        hosts[host] = {
            "verdict": result.get("verdict"),
            "release": result.get("release"),
            "deployed": deployed,
            "deployed_release": deployed_release,
            "live": job,
            "state": (result.get("trainer") or {}).get("state"),
            "training": state_is(result.get("trainer"), "training"),
        }
    # What the job's deployment was: the one most of its hosts recorded last.
    deployed_ids = {h: v["deployed"].get("rdzv_id") for h, v in hosts.items()}
    expected = _most_common(list(deployed_ids.values()))
    of_job = [v for v in hosts.values() if v["deployed"].get("rdzv_id") == expected]
    deployed = of_job[0]["deployed"] if of_job else {}
    release = of_job[0]["deployed_release"] if of_job else None
    for host, view in hosts.items():
        if deployed_ids[host] != expected:
            findings.append(_finding(
                "job_rendezvous", host, f"deployment of job {name} ({expected})",
                f"{deployed_ids[host] or 'a deployment on its own'} (release {view['release']})",
                f"this host was deployed or rolled back without the others; {redeploy}",
            ))  # fmt: skip
        elif view["release"] != release:
            findings.append(_finding(
                "job_release", host, release, view["release"],
                f"current was switched on this host alone; every host of a job runs one release; "
                f"{redeploy}",
            ))  # fmt: skip
        live = view["live"]
        if not view["training"]:
            findings.append(_finding(
                "job_trainer", host, "a trainer of the job", view["state"] or "no trainer",
                f"one host's trainer stopping stops the job's training; {redeploy}",
            ))  # fmt: skip
        elif live.get("rdzv_id") != expected:
            findings.append(_finding(
                "job_rendezvous", host, f"rendezvous {expected}", live.get("rdzv_id"),
                f"its trainer is not in the job's rendezvous; {redeploy}",
            ))  # fmt: skip
        elif live.get("lead") and live.get("world_size") != deployed.get("world_size"):
            findings.append(_finding(
                "job_world_size", host, deployed.get("world_size"), live.get("world_size"),
                f"the lead counts another number of ranks than the job deployed; {redeploy}",
            ))  # fmt: skip
        if view["verdict"] == "drift":
            kinds = sorted({f.get("kind") for f in report[host].get("findings") or []})
            findings.append(_finding(
                "job_host_drift", host, "no drift", ", ".join(kinds),
                "see the host's own findings",
            ))  # fmt: skip
    broken = any(f["kind"] in BROKEN for f in findings)
    # stop.yml stopped the whole job on purpose: its own verdict, not a broken job.
    stopped = len(hosts) == len(members) and all(v["verdict"] == "stopped" for v in hosts.values())
    if stopped:
        findings = []
    return {
        "verdict": "stopped" if stopped else "broken" if broken else "drift" if findings else "ok",
        "hosts": members,
        "release": release,
        "rdzv_id": expected,
        "world_size": deployed.get("world_size"),
        "nodes": {h: {k: v[k] for k in ("release", "state", "live")} for h, v in hosts.items()},
        "findings": findings,
    }


def job_verdicts(report: dict, hostvars: Any, inventory_hosts: list[str]) -> dict:
    """verify.yml's verdict per job of the audited hosts: ok, drift (trains, but a host drifted
    or runs another release) or broken (a host missing, not training, or outside the job)."""
    names = sorted({str(hostvars[h].get("dflash_job") or "") for h in report} - {""})
    return {
        name: _judge_job(name, job_members(hostvars, name, inventory_hosts), report, hostvars)
        for name in names
    }


def job_report_lines(jobs: dict) -> list[str]:
    """The job table of verify.yml: a line per job, one per host, then the findings."""
    lines = []
    for name, job in sorted(jobs.items()):
        lines.append(
            f"JOB {name}: {job['verdict']} ({len(job['hosts'])} hosts, release {job['release']}, "
            f"rendezvous {job['rdzv_id']}, world size {job['world_size']})"
        )
        for host in job["hosts"]:
            node = job["nodes"].get(host)
            if node is None:
                lines.append(f"  {host:<16} not read")
                continue
            live = node["live"]
            lines.append(
                f"  {host:<16} {node['state'] or 'no trainer':<12} release {node['release']}  "
                f"node {live.get('node_rank', '-')}{' (lead)' if live.get('lead') else ''}  "
                f"rendezvous {live.get('rdzv_id') or '-'}  world size {live.get('world_size', '-')}"
            )
        for item in job["findings"]:
            lines.append(
                f"  {item['kind']:<16} {item['host']:<16} expected {item['expected']}, "
                f"found {item['found']}; fix: {item['hint']}"
            )
    return lines


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_job_verdicts": job_verdicts,
            "dflash_job_report_lines": job_report_lines,
        }
