# What verify says of the state root's own records when a fault damaged them: history.jsonl
# lines that are not records (`history`), a trainer.json that lost track of the trainer
# (`trainer_record`), checkpoints the trainer could not read or not write (`checkpoint`), and
# a file system under the reserve that keeps those writes possible (`disk`).
# Standard library only: the controller's filters use it.
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import MB
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_hints import restart_command


def history_findings(facts: dict) -> list[dict]:
    """One `history` finding per damaged line of history.jsonl (readers skip it)."""
    path = f"{facts.get('root')}/history.jsonl"
    return [
        finding(
            "history",
            f"line {item['line']}: one JSON record",
            f"{item['bytes']} bytes that are not one: {item['text']!r}",
            "a writer was cut short (or the file was edited), so what that line recorded is "
            "unknown to verify, rollback.yml and history.yml; the next deploy or rollback "
            "moves a torn last line to history.jsonl.torn (now, keeping the current release as "
            f"recorded: {restart_command(facts)}), any other line you move there by hand",
            path=path,
            line=item["line"],
        )
        for item in facts.get("history_damaged") or []
    ]


def lost_history_findings(facts: dict) -> list[dict]:
    """`history`: a root with releases whose history.jsonl is gone, or names no deployment of
    the current release: what may be rolled back to, and what keep-N may delete, is unknown."""
    current = (facts.get("current") or {}).get("release")
    # The release a deploy or rollback holding the lock makes current has its line written at
    # that run's record step: not lost (the lock's own finding says the run is in progress, or
    # was interrupted and how to finish it).
    in_flight = (facts.get("deploy_lock") or {}).get("release")
    unknown = [name for name in facts.get("unknown_releases") or [] if name != in_flight]
    releases = [name for name in facts.get("releases") or [] if name != in_flight]
    if not releases or not (
        facts.get("history_exists") is False or (current and current in unknown)
    ):
        return []
    path = f"{facts.get('root')}/history.jsonl"
    found = "missing" if facts.get("history_exists") is False else f"no line for {current}"
    return [
        finding(
            "history",
            "a history that names the deployments of the releases on the target",
            f"{path} {found}; releases it does not name: {', '.join(unknown) or 'none'}",
            "history was lost or cut short: rollback.yml and history.yml do not know these "
            "releases, and keep-N keeps them rather than delete what history forgot; put the "
            "file back from a backup, or roll back by name (rollback.yml -e dflash_release=<id> "
            "records it again) and remove the ones you do not want by hand",
            path=path,
        )
    ]


def record_findings(facts: dict) -> list[dict]:
    """`trainer_record`: trainer.json lost track of the trainer that runs (found anyway)."""
    trainers = facts.get("trainers") or {}
    problem = trainers.get("record_problem")
    if not problem:
        return []
    return [
        finding(
            "trainer_record",
            "trainer.json naming the trainer that runs",
            problem,
            "the trainer is found and judged from its run folder's copy; the next deploy or "
            "rollback rewrites trainer.json from it, a healthy trainer not restarted (now, "
            f"keeping the current release as recorded: {restart_command(facts)})",
            path=f"{facts.get('root')}/trainer.json",
        )
    ]


def checkpoint_findings(facts: dict) -> list[dict]:
    """`checkpoint`: files the running trainer skipped as unreadable when it resumed, and a
    checkpoint it could not write (the disk is full): both lose steps on the next restart."""
    out, runs = [], set()
    # One trainer's processes (its supervisor, torchrun, ranks) read one status.json.
    for proc in sorted((facts.get("trainers") or {}).get("processes") or [],
                       key=lambda p: p["pid"]):  # fmt: skip
        status = proc.get("status") or {}
        if not status or proc.get("run_id") in runs:
            continue
        runs.add(proc.get("run_id"))
        saved = (status.get("checkpoint") or {}).get("step")
        for item in status.get("checkpoint_skipped") or []:
            if saved is not None and (item.get("step") or 0) <= saved:
                continue  # rewritten since, or older than a good one: no resume reads it
            out.append(
                finding(
                    "checkpoint",
                    f"checkpoint of step {item.get('step')} readable",
                    f"cannot be read ({item.get('error')})",
                    "the trainer resumed from an older one (step "
                    f"{status.get('resumed_from_step')}); move the file away, it is never used",
                    path=item.get("path"),
                    pid=proc["pid"],
                )
            )
        failed = status.get("checkpoint_error") or {}
        if failed and (saved is None or failed.get("step", 0) > saved):
            out.append(
                finding(
                    "checkpoint",
                    f"a checkpoint at step {failed.get('step')}",
                    f"not written: {failed.get('error')}",
                    "free space where the checkpoints go; the trainer trains on and saves again "
                    f"at its next interval (a restart now resumes from step {saved})",
                    path=failed.get("path"),
                    pid=proc["pid"],
                )
            )
    return out


def disk_findings(facts: dict, reserve_mb: float) -> list[dict]:
    """`disk`: the root's file system has less free than dflash_disk_reserve_mb: the trainer's
    next checkpoint, and any deploy, may fail to write (and say so)."""
    disk = facts.get("disk") or {}
    free = disk.get("free_bytes")
    if free is None or not reserve_mb or free >= reserve_mb * MB:
        return []
    return [
        finding(
            "disk",
            f"at least {reserve_mb:g} MB free (dflash_disk_reserve_mb)",
            f"{free / MB:,.0f} MB free of {(disk.get('total_bytes') or 0) / MB:,.0f} MB",
            "free space on that file system (envs/ no release uses, old checkpoints, other "
            "files): the trainer's checkpoints fail on a full disk, and a deploy refuses to "
            "start with less than the reserve",
            path=disk.get("path"),
        )
    ]


def oom_findings(facts: dict) -> list[dict]:
    """`oom_kill`: the kernel OOM-killed processes in the target's memory cgroup (a container's
    own) since the recorded trainer started: a trainer process, or one beside it, ran out of
    the memory the container may use. The supervisor restarts a killed trainer; it would be
    killed again at the same point."""
    record = (facts.get("trainers") or {}).get("record") or {}
    memory = facts.get("memory") or {}
    then, now = record.get("oom_kills"), memory.get("oom_kills")
    if not isinstance(then, int) or not isinstance(now, int) or now <= then:
        return []
    limit = memory.get("limit_mb")
    return [
        finding(
            "oom_kill",
            f"no process OOM-killed since the trainer started at {record.get('started_at')}",
            f"{now - then} process(es) OOM-killed by the kernel since then (the memory limit "
            f"is {f'{limit} MB' if limit else 'not readable'})",
            "give the container more memory (Proxmox: pct set <vmid> -memory <MB>) or the "
            "trainer less to hold (fewer processes, a smaller token budget); "
            "dflash_trainer_memory_mb lets preflight check a layout against the limit",
            pid=record.get("pid"),
        )
    ]


def state_findings(facts: dict, reserve_mb: float = 0) -> list[dict]:
    return (
        history_findings(facts)
        + lost_history_findings(facts)
        + record_findings(facts)
        + checkpoint_findings(facts)
        + disk_findings(facts, reserve_mb)
        + oom_findings(facts)
    )
