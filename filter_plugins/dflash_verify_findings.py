# Controller-side filters: verify's findings from a facts document (docs/verify.md)
# and its table. The checks of the inputs are filter_plugins/dflash_inputs.py's. Just over 300
# lines: one function a kind of finding, read together as verify's one rule book.
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    findings as cache_findings,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import (
    changed_under,
    identity,
    recorded,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_hints import (
    redeploy_command,
    restart_command,
    stopped_on_purpose,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import (
    last_deployment,
    records_code,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    describe,
    holder_alive,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state_findings import (
    state_findings,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_supervision import (
    supervision_findings,
)


def lock_findings(facts: dict, stale_after: float) -> list[dict]:
    """A deploy, rollback or stop that holds the lock now, or one that was interrupted."""
    lock = facts.get("deploy_lock")
    if not lock:
        return []
    holder = lock.get("holder") or {}
    dead = False in (lock.get("holder_alive"), holder_alive(holder))
    age = lock.get("age_s")
    if dead or (age is not None and age > stale_after):
        return [
            finding(
                "release",
                "no interrupted run",
                f"{describe(lock)} was interrupted",
                f"run {lock.get('action') or 'deploy'}.yml again: it takes the lock over and "
                "finishes or replaces what that run left",
                state="interrupted",
            )
        ]
    return [
        finding(
            "release",
            "no run in progress",
            f"{describe(lock)} is in progress",
            "verify again once it has ended",
            state="in_progress",
        )
    ]


def release_findings(facts: dict, stale_after: float = 1800) -> list[dict]:
    current = facts.get("current") or {}
    locked = lock_findings(facts, stale_after)
    if current.get("not_a_link"):
        return [
            *locked,
            finding(
                "release",
                "current -> a release",
                f"{facts.get('root')}/current is a folder or file, not a link",
                "deploy.yml moves it aside (kept) and puts the link back",
            ),
        ]
    if not facts.get("root_exists"):
        return [
            finding(
                "release",
                "a deployed state root",
                f"{facts.get('root')} is missing",
                "run deploy.yml",
            )
        ]
    if current.get("dangling"):
        return [
            finding(
                "release",
                "current -> a complete release",
                f"current -> {current.get('link')} (missing or incomplete)",
                "run rollback.yml, or deploy.yml",
            )
        ]
    if not current.get("release"):
        return [
            *locked,
            finding("release", "a current release", "no current link", "run deploy.yml"),
        ]
    found: list[dict] = list(locked)
    release = current["release"]
    manifest = current.get("manifest") or {}
    if not current.get("manifest_consistent", True):
        found.append(
            finding(
                "release",
                f"MANIFEST.json of {release} as deployed",
                "a MANIFEST.json whose file hashes do not add up to its tree hash",
                "redeploy: the manifest was edited on the target",
                path="MANIFEST.json",
            )
        )
    recorded = [e for e in facts.get("history", []) if e.get("release") == release
                and records_code(e)]  # fmt: skip
    if recorded and recorded[-1].get("tree_sha256") != manifest.get("tree_sha256"):
        found.append(
            finding(
                "release",
                recorded[-1].get("tree_sha256"),
                manifest.get("tree_sha256"),
                f"release {release} differs from what history recorded; put it back: "
                f"{redeploy_command(facts)}",
            )
        )
    last = last_deployment(facts.get("history") or [])
    # An interrupted run (named above) explains a current that history does not know yet, and
    # so may a damaged line of history (the finding `history` names it).
    if last and last.get("release") != release and not locked and not facts.get("history_damaged"):
        found.append(
            finding(
                "release",
                last.get("release"),
                release,
                "current was switched outside deploy.yml/rollback.yml; redeploy or "
                "roll back to record it",
            )
        )
    return found


def code_findings(facts: dict) -> list[dict]:
    files = facts.get("files") or {}
    release = (facts.get("current") or {}).get("release")
    hints = {
        "changed": ("content as in the manifest", "edited on the target"),
        "missing": ("present", "missing"),
        "extra": ("absent (not in the manifest)", "present"),
    }
    out = []
    for state, (expected, found) in hints.items():
        for path in files.get(state, []):
            out.append(
                finding(
                    "code",
                    expected,
                    found,
                    f"put release {release} back: {redeploy_command(facts)}",
                    path=path,
                    state=state,
                )
            )
    return out


def trainer_findings(facts: dict, heartbeat_max_age: float) -> list[dict]:
    current = (facts.get("current") or {}).get("release")
    tree = ((facts.get("current") or {}).get("manifest") or {}).get("tree_sha256")
    deployment = facts.get("deployment") or {}
    processes = (facts.get("trainers") or {}).get("processes") or []
    # One trainer is one job: torchrun and its workers (each in its own session) together.
    groups: dict[int, list[dict]] = {}
    for proc in processes:
        groups.setdefault(proc.get("job", proc["pgid"]), []).append(proc)
    out = supervision_findings(facts)
    crash_loop = any(item["kind"] == "crash_loop" for item in out)
    # stop.yml notes itself in trainer.json: a stop on purpose is the `stopped` verdict
    # (verify_verdict), not drift.
    stopped = stopped_on_purpose(facts)
    if not groups and deployment.get("result") == "healthy" and not crash_loop and not stopped:
        out.append(
            finding(
                "not_running",
                f"a trainer of release {current}",
                "no trainer process",
                f"read runs/latest/train.log, then start it again as recorded: "
                f"{restart_command(facts)}",
            )
        )
    if len(groups) > 1:
        pids = sorted(min(p["pid"] for p in group) for group in groups.values())
        out.append(
            finding(
                "duplicate_trainer",
                "one trainer",
                f"{len(groups)} trainers: pids {pids}",
                f"{restart_command(facts, restart=True)} stops them all and starts one, as its "
                "deployment recorded it",
                pids=pids,
            )
        )
    for group in groups.values():
        leader = min(group, key=lambda p: p["pid"])
        status = next((p["status"] for p in group if p.get("status")), None) or {}
        runs_tree = status.get("code_tree_sha256")
        if (runs_tree and runs_tree != tree) or (leader.get("release") not in (None, current)):
            out.append(
                finding(
                    "stale_process",
                    f"code of release {current} ({(tree or '')[:12]})",
                    f"pid {leader['pid']} runs release {leader.get('release')} "
                    f"({(runs_tree or 'unknown')[:12]}) since {leader.get('started_at')}",
                    f"{restart_command(facts, restart=True)} replaces it",
                    pid=leader["pid"],
                )
            )
        age = next((p["heartbeat_age_s"] for p in group if p.get("heartbeat_age_s") is not None),
                   None)  # fmt: skip
        if state_is(status, "alive") and age is not None and age > heartbeat_max_age:
            out.append(
                finding(
                    "heartbeat_stale",
                    f"status.json updated within {heartbeat_max_age:g} s",
                    f"pid {leader['pid']}: last update {age:g} s ago (step {status.get('step')})",
                    "the trainer hangs: read its train.log, then "
                    + restart_command(facts, restart=True),
                    pid=leader["pid"],
                )
            )
    return out


def _pin(package: str, version: str | None, absent: str) -> str:
    """`torch==2.11.0`, or `six (not in the lock)` where there is no version to name."""
    return f"{package}=={version}" if version else f"{package} ({absent})"


def setup_findings(facts: dict) -> list[dict]:
    """run.sh, env and cache against what the deployment of current recorded."""
    deployment = facts.get("deployment") or {}
    if not deployment:
        return []
    out = []
    run_sh = facts.get("run_sh") or {}
    if deployment.get("run_sh_sha256") and run_sh.get("sha256") != deployment["run_sh_sha256"]:
        out.append(
            finding(
                "run_script",
                f"run.sh as deployed (sha256 {deployment['run_sh_sha256'][:12]})",
                "; ".join(facts.get("run_sh_changes") or [])
                or (
                    f"sha256 {run_sh['sha256'][:12]}" if run_sh.get("sha256") else "run.sh missing"
                ),
                "run.sh was edited on the target, or a write of it failed on a full disk "
                f"(see `disk`); put it back as recorded: {restart_command(facts)}",
                path=run_sh.get("path"),
            )
        )
    env = facts.get("environment")
    if env and not env.get("exists"):
        out.append(
            finding(
                "environment",
                f"env {env['lock_id']}",
                "missing",
                f"build it again as recorded: {restart_command(facts)}",
                path=env.get("path"),
            )
        )
    for item in (env or {}).get("drift", []):
        out.append(
            finding(
                "environment",
                _pin(item["package"], item.get("expected"), "not in the lock"),
                _pin(item["package"], item.get("found"), "not installed"),
                f"the env was changed by hand; rebuild it from the lock: {restart_command(facts)}",
                package=item["package"],
            )
        )
    processes = (facts.get("trainers") or {}).get("processes") or []
    out += cache_findings(facts.get("cache"), deployment.get("lock") or {}, processes)
    return out


def data_findings(facts: dict) -> list[dict]:
    """`data`: what lies where a trainer's data came from is no longer what it read (a store
    prepared again, truncated or removed; a JSONL file changed): a running trainer's, or the
    recorded run's while its trainer is down (a back-off, a crash loop)."""
    out, seen = [], set()
    now = facts.get("data") or {}
    trainers = facts.get("trainers") or {}
    down = trainers.get("down_status")
    down_as = (trainers.get("supervisor") or {}).get("state") or (down or {}).get("state")
    # A down run's processes (its supervisor) read no data: the run is judged once, as down.
    readers = sorted(
        (p for p in trainers.get("processes") or []
         if not down or p.get("run_id") != down.get("run_id")),
        key=lambda p: p["pid"],
    )  # fmt: skip
    for proc in readers + ([{"pid": None, "status": down}] if down else []):
        reported = (proc.get("status") or {}).get("data") or {}
        path = reported.get("path")
        if path in seen:
            continue
        seen.add(path)
        why = changed_under(reported, now.get(path))
        if why:
            sha = str(reported.get("content_sha256") or "")[:12]
            hint = (
                "the trainer still trains on what it read (a store replaced whole keeps its "
                f"old files open; one changed in place mixes both): {restart_command(facts)} "
                f"starts it again on the data at {path} now, with the run.sh and env its "
                "deployment recorded; or put the data it read back there"
                if proc["pid"] is not None
                else f"the trainer is down ({down_as}), and its next "
                f"start reads what lies at {path} now: prepare it again (python -m dflash.data "
                "prepare --force, docs/training-data.md) or put back the data it read, then "
                f"{restart_command(facts)}"
            )
            out.append(
                finding(
                    "data",
                    f"the {reported.get('kind')} {path} as the trainer read it at start"
                    + (f" (sha256 {sha})" if sha else ""),
                    why,
                    hint,
                    path=path,
                    pid=proc["pid"],
                )
            )
    return out


def dflash_findings(
    facts: dict, heartbeat_max_age: float = 60, lock_stale_after: float = 1800,
    disk_reserve_mb: float = 0,
) -> list[dict]:  # fmt: skip
    """Every drift in one target's facts document; an empty list means the target is clean."""
    return (
        release_findings(facts, lock_stale_after)
        + code_findings(facts)
        + trainer_findings(facts, heartbeat_max_age)
        + setup_findings(facts)
        + data_findings(facts)
        + state_findings(facts, disk_reserve_mb)
    )


def while_in_progress(findings: list[dict]) -> list[dict]:
    """A deploy, rollback or stop in progress (its lock held by a live run) is the one finding:
    what that run is changing (the old trainer still stopping, the new one starting, a release
    made current and not yet recorded) is judged once it has ended, as its hint says."""
    in_progress = [item for item in findings if item.get("state") == "in_progress"]
    return in_progress or findings


def verify_verdict(facts: dict, findings: list[dict]) -> str:
    """A host's verdict: `drift` with any finding, else `stopped` when stop.yml stopped its
    trainer (on purpose: not an alert), else `ok`."""
    if findings:
        return "drift"
    return "stopped" if stopped_on_purpose(facts) else "ok"


def dflash_report_lines(findings: list[dict], facts: dict | None = None) -> list[str]:
    """A readable table: one line per finding."""
    stopped = stopped_on_purpose(facts or {})
    if not findings and stopped:
        return [
            f"STOPPED: the trainer of release {stopped['release']} was stopped on purpose by "
            f"playbooks/{stopped['by']} at {stopped['at']}; no drift. Start it again as "
            f"recorded: {stopped['hint']}"
        ]
    if not findings:
        return ["OK: no drift"]
    lines = [f"{'KIND':<18} {'WHAT':<34} {'EXPECTED':<32} FOUND"]
    for item in findings:
        gpu = f"GPU {item['gpu']}" if item.get("gpu") is not None else ""
        what = str(item.get("path") or item.get("package") or item.get("pid") or gpu)
        lines.append(f"{item['kind']:<18} {what:<34} {item['expected']!s:<32} {item['found']}")
        lines.append(f"{'':<18} fix: {item['hint']}")
    return lines


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_findings": dflash_findings,
            "dflash_while_in_progress": while_in_progress,
            "dflash_report_lines": dflash_report_lines,
            "dflash_verify_verdict": verify_verdict,
            "dflash_data_record": recorded,
            "dflash_data_identity": identity,
        }
