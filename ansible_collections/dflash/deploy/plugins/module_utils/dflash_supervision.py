# What verify says of the trainer's supervision (dflash/supervision/supervisor.py writes
# supervisor.json in
# the run folder): restarts of the current deployment, its goodput, and the findings `hung`,
# `trainer_down` and `crash_loop`. Standard library only: the controller's filters use it.
from __future__ import annotations

import time
from datetime import datetime

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_hints import restart_command
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import (
    state_is,
    supervisor_is,
)

# The hang limit is the supervisor's: supervisor.json says it (`hang_after_s`, the limit it
# judges by now). A run without a supervisor.json (started by a release from before the
# supervisor) is judged by the automatic limit of those days, frozen: max(10 steps, 300 s).
BEFORE_HANG_FLOOR_S = 300.0
BEFORE_HANG_STEPS = 10


def _age(stamp: str | None, now: float) -> float | None:
    try:
        return round(now - datetime.fromisoformat(str(stamp)).timestamp(), 1)
    except ValueError:
        return None


def supervision_view(facts: dict) -> dict | None:
    """The recorded run's supervision: state, restarts, last error and goodput; None for a run
    started without the supervisor."""
    record = (facts.get("trainers") or {}).get("supervisor")
    if not record:
        return None
    return {
        "state": record.get("state"),
        "state_is": record.get("state_is"),  # what the state means (dflash_states)
        "restarts": record.get("restarts") or {},
        "last_error": record.get("last_error"),
        "goodput": record.get("goodput"),
        "hang_after_s": record.get("hang_after_s"),
        "policy": record.get("policy"),
        "updated_at": record.get("updated_at"),
        "backoff_until": record.get("backoff_until"),
        "pid": record.get("pid"),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def supervision_line(view: dict | None) -> str | None:
    """`restarts: 2 (last signal SIGKILL at ..., first step 7.9 s later) | goodput 93.1% of 3600
    s: startup 40 s, checkpoint 2 s, lost 5 s, hang 0 s, down 10 s`, or None."""
    if not view:
        return None
    restarts = view["restarts"]
    count = restarts.get("count") or 0
    text = f"restarts: {count}"
    if count:
        back = restarts.get("time_to_first_step_s")
        text += f" (last: {restarts.get('last_reason')} at {restarts.get('last_at')}, " + (
            f"first step {_seconds(back)} later)" if back is not None else "no step since)"
        )
    if supervisor_is(view, "not_training"):
        text += f", now {view['state'].replace('_', ' ')}"
    good = view.get("goodput") or {}
    if good.get("ratio") is not None:
        causes = ", ".join(f"{k} {_seconds(v)}" for k, v in (good.get("badput_s") or {}).items())
        text += f" | goodput {good['ratio'] * 100:.1f}% of {_seconds(good['wall_s'])}: {causes}"
    return text


def _hang_limit(view: dict | None, status: dict) -> float:
    if view and view.get("hang_after_s"):
        return float(view["hang_after_s"])
    return max(BEFORE_HANG_STEPS * (status.get("step_s_median") or 0.0), BEFORE_HANG_FLOOR_S)


def down_finding(view: dict, log: str, run_id: str | None, now: float) -> dict:
    """`trainer_down`: the trainer ended and its supervisor waits out a back-off before the
    next start: no training now, however well the restart may go (a crash loop in progress
    looks the same until its last restart)."""
    restarts, policy = view["restarts"], view.get("policy") or {}
    down = _age(restarts.get("last_at"), now)
    back = -(_age(view.get("backoff_until"), now) or 0.0) if view.get("backoff_until") else None
    return finding(
        "trainer_down",
        "a trainer training under its supervisor",
        f"down since {restarts.get('last_at')}"
        + (f" ({_seconds(down)})" if down is not None else "")
        + f": {view.get('last_error')}; restart {restarts.get('in_window', restarts.get('count'))}"
        f" of {policy.get('max_restarts')} within {policy.get('window_s', 0):g} s, "
        + (f"the next start in {_seconds(max(back, 0.0))}" if back is not None
           else "the next start after its back-off"),
        f"the supervisor starts it again by itself; read {log} for the cause (after "
        f"{policy.get('max_restarts')} restarts within the window it stops: crash_loop)",
        run_id=run_id,
    )  # fmt: skip


def unsupervised(view: dict | None, processes: list[dict]) -> list[int]:
    """The pids of the run's trainers when its supervisor's process is no longer among them
    (killed, or dead of its own error) while it says it supervises; [] otherwise."""
    if not view or not view.get("pid") or not supervisor_is(view, "supervising"):
        return []
    pids = [p["pid"] for p in processes]
    return [] if not pids or view["pid"] in pids else sorted(pids)


def supervision_findings(facts: dict, now: float | None = None) -> list[dict]:
    """`crash_loop`: the supervisor gave up (no trainer runs); `trainer_down`: it waits out a
    back-off before the next start; `hung`: the recorded trainer's process lives and its
    status says running, but no step was made within the hang limit."""
    now = time.time() if now is None else now
    trainers = facts.get("trainers") or {}
    view = supervision_view(facts)
    record = trainers.get("record") or {}
    run_id = record.get("run_id")
    log = f"runs/{run_id}/train.log"
    out = []
    processes = trainers.get("processes") or []
    if view and supervisor_is(view, "gave_up") and not processes:
        policy = view.get("policy") or {}
        why = (
            f"the trainer kept failing: {policy.get('max_restarts')} restarts within "
            f"{policy.get('window_s', 0):g} s"
            if policy.get("max_restarts")
            else "the trainer failed, and restarts are off (dflash_restart_policy.enabled)"
        )
        out.append(
            finding(
                "crash_loop",
                "a trainer under its restart policy",
                f"{why}, last: {view.get('last_error')}",
                f"read {log}, fix the cause, then {restart_command(facts, restart=True)} (as its "
                "deployment recorded it)",
                run_id=run_id,
            )
        )
    # Only while the supervisor lives: a dead one starts nothing (not_running says so).
    if view and supervisor_is(view, "down") and processes:
        out.append(down_finding(view, log, run_id, now))
    gone = unsupervised(view, processes)
    if gone:
        out.append(
            finding(
                "supervisor_gone",
                f"the trainer under its supervisor (pid {view['pid']})",
                f"the supervisor (pid {view['pid']}) is gone and the trainer (pid "
                f"{', '.join(map(str, gone))}) trains on without it: a crash or a hang is not "
                "restarted, a stop does not reach it",
                f"read {log} for how the supervisor ended; then, at a step that suits (the "
                f"trainer checkpoints on SIGTERM), {restart_command(facts, restart=True)}",
                run_id=run_id,
            )
        )
    ours = [p for p in processes if p.get("run_id") == run_id and p.get("status")]
    status = ours[0]["status"] if ours else {}
    idle = _age(status.get("last_step_at"), now)
    limit = _hang_limit(view, status)
    if state_is(status, "steps_due") and idle is not None and idle > limit:
        attempts = ((facts.get("trainers") or {}).get("supervisor") or {}).get("attempts") or []
        dumped = (attempts[-1] if attempts else {}).get("hang_dump")
        out.append(
            finding(
                "hung",
                f"a training step within {limit:g} s (dflash_hang_after)",
                f"no step for {idle:g} s: step {status.get('step')} was made at "
                f"{status.get('last_step_at')}",
                f"the stacks are in {log}; the supervisor restarts it"
                if dumped
                else "the supervisor dumps its stacks to "
                f"{log} and restarts it (without a supervisor: "
                f"{restart_command(facts, restart=True)})",
                run_id=run_id,
            )
        )
    return out
