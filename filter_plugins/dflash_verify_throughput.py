# Controller-side filters of verify.yml for the running trainer's speed: the `throughput`
# finding, and the per-host figures of the table and the reports (trainer, tokens/s beside
# its references, what each check looked at). The `gpu` finding is in dflash_verify_gpu.py.
from __future__ import annotations

from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_contention import (
    AFTER_S,
    MAX_WAIT,
    contention_view,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import length_shift
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_gpu import judge_facts
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_judged import judged_trainer
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_supervision import (
    supervision_line,
    supervision_view,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    WAIT_NOISE,
    band,
    reference_speed,
)

# The trainer's window (dflash/train.py Throughput) for status files that do not say it.
DEFAULT_WINDOW = 20
# A drop is drift only when every one of the last CONSECUTIVE completed windows is under the
# band: one slow window on a busy host is not. On an H200 at the 8B shape (0.26 s a step,
# windows of 20 steps) a 4x collapse fills three windows in about a minute.
CONSECUTIVE = 3
DIFF_FASTEST = "ansible-playbook diff.yml -e dflash_diff_from=fastest"


def _speed(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "-"


def trainer_summary(facts: dict) -> dict | None:
    found = judged_trainer(facts)
    if found is None:
        return None
    leader, status = found
    return {
        "pid": leader["pid"],
        "run_id": status.get("run_id") or leader.get("run_id"),
        "state": status.get("state"),
        "state_is": status.get("state_is"),  # what the state means (dflash_states.state_is)
        "step": status.get("step"),
        "started_at": leader.get("started_at"),
        "age_s": leader.get("age_s"),
        "heartbeat_age_s": leader.get("heartbeat_age_s"),
        "job": status.get("job"),  # which node of which torchrun job (dflash.cluster.job_fields)
    }


def compile_cache_view(facts: dict) -> dict | None:
    """The compile cache the judged trainer runs on, as its status.json says (fingerprint,
    warm or cold start, first step, hits and misses, canary), its files against their recorded
    hashes, and the caches or files set aside under the root, newest first; None when there is
    none of these."""
    found = judged_trainer(facts)
    running = (found[1] if found else {}).get("compile_cache")
    cache = facts.get("cache") or {}
    aside = cache.get("moved_aside") or []
    hashes = cache.get("hashes")
    if not running and not aside and not hashes:
        return None
    return {**(running or {}), "moved_aside": aside, "hashes": hashes}


def compile_cache_line(view: dict | None) -> str | None:
    """`compile cache: 3f2a... started warm, first step 24.1 s, 46 hits / 0 misses, canary ok`."""
    if not view:
        return None
    parts = []
    if view.get("fingerprint") is not None:
        first = view.get("first_step_s")
        canary = view.get("canary")
        verdict = (
            "canary ok" if canary and canary.get("ok")
            else f"canary FAILED: {canary.get('reason')}" if canary
            else "canary pending" if view.get("started_warm")
            else "no canary (a cold start compiles anew)"
        )  # fmt: skip
        parts.append(
            f"{view['fingerprint']} started {'warm' if view.get('started_warm') else 'cold'}, "
            f"first step {'-' if first is None else f'{first:g} s'}, {view.get('hits', 0)} hits / "
            f"{view.get('misses', 0)} misses, {verdict}"
        )
    hashes = view.get("hashes") or {}
    if hashes.get("checked") or hashes.get("unrecorded"):  # an empty folder: nothing to say
        damaged = len(hashes["damaged"])
        parts.append(
            f"{hashes['checked'] - damaged} of {hashes['checked']} files as compiled"
            + (f", {damaged} DAMAGED" if damaged else "")
            + (f", {len(hashes['unrecorded'])} not yet hashed" if hashes["unrecorded"] else "")
        )
    aside = view.get("moved_aside") or []
    if aside:
        newest = aside[0]
        parts.append(
            f"{len(aside)} set aside, newest {newest['name']}"
            + (f" ({newest['reason']})" if newest.get("reason") else "")
        )
    return "compile cache: " + "; ".join(parts)


def _window(status: dict) -> dict:
    window = status.get("throughput_window")
    if window:
        return window
    # An older trainer: the steps of this run but its first (compilation), up to the window.
    done = (status.get("step") or 0) - (status.get("resumed_from_step") or 0) - 1
    return {"steps": max(0, min(done, DEFAULT_WINDOW)), "size": DEFAULT_WINDOW}


def slowest_stage(stages: dict | None) -> dict | None:
    timed = {k: v for k, v in (stages or {}).items() if k != "step" and v is not None}
    if not timed:
        return None
    name = max(timed, key=timed.__getitem__)
    return {"name": name, "seconds": timed[name]}


def grown_stage(now: dict | None, then: dict | None) -> str:
    """Which stage's seconds per step grew most since the health check, as a hint."""
    if not then:
        slowest = slowest_stage(now)
        return (
            f"slowest stage now: {slowest['name']} {slowest['seconds']:.3f} s per step (no "
            "stages recorded at the health check)"
            if slowest
            else "no stage times in status.json"
        )
    now = now or {}
    growth = {
        name: now[name] - then[name]
        for name in now
        if name != "step" and now.get(name) is not None and then.get(name) is not None
    }
    step_then, step_now = then.get("step"), now.get("step")
    step_growth = (step_now or 0) - (step_then or 0)
    name = max(growth, key=growth.__getitem__) if growth else None
    # Time that no timed stage took: data, sleeps, a process stopped or starved of CPU. A
    # stage that did not grow is never named as the one that grew.
    if name is None or growth[name] <= 0 or growth[name] < step_growth / 2:
        return (
            f"the time went outside the timed stages: a step took {step_then} s at the health "
            f"check, {step_now} s now (data, sleeps, a stopped or starved process)"
        )
    return f"stage {name} grew most: {then[name]:.3f} -> {now[name]:.3f} s per step"


def _judged_speed(status: dict) -> tuple[float | None, float | None, str]:
    """The figure a verdict is given on, the same as measured, and over what: the fastest of
    the last CONSECUTIVE completed windows (a drop must hold over all of them), with the time
    the trainer waited for a CPU left out where it says (a busy host is not a slower trainer);
    for a trainer that writes no windows (an older release) its rolling figure."""
    windows = status.get("throughput_windows")
    if windows is None:
        steps = _window(status)["steps"]
        return status.get("tokens_per_s"), status.get("tokens_per_s"), f"the last {steps} steps"
    if len(windows) < CONSECUTIVE:
        return None, None, f"too early to judge: {len(windows)} of {CONSECUTIVE} windows measured"
    size = (status.get("throughput_window") or {}).get("size") or DEFAULT_WINDOW
    unstarved = status.get("throughput_windows_unstarved") or []
    judged = unstarved if len(unstarved) == len(windows) else windows
    return (
        max(judged[-CONSECUTIVE:]),
        max(windows[-CONSECUTIVE:]),
        f"the last {CONSECUTIVE} windows of {size} steps (the fastest window's median step)",
    )


def cpu_wait_line(judged: object, measured: object) -> str | None:
    """What the judged figure leaves out, when that is more than noise."""
    if not isinstance(judged, (int, float)) or not isinstance(measured, (int, float)):
        return None
    if judged <= 0 or measured >= WAIT_NOISE * judged:
        return None
    return (
        f"{_speed(measured)} tokens/s as measured: the trainer waited for a CPU "
        f"{1 - measured / judged:.0%} of the time (a busy host), left out of the "
        f"{_speed(judged)} judged"
    )


def throughput_view(facts: dict, min_ratio: float = 0.8, heartbeat_max_age: float = 60) -> dict:
    """The running trainer's tokens/s beside the figures it is judged against; `judged` says
    whether a verdict can be given, `note` why not (or over what it was given)."""
    refs = facts.get("throughput_references") or {}
    view: dict = {
        "tokens_per_s": None,
        "window": None,
        "health_check": refs.get("health_check"),
        "fastest": refs.get("fastest"),
        "ratios": {},
        "bands": {},  # the share of each reference a window must reach (band)
        "stages": None,
        "slowest_stage": None,
        "min_ratio": min_ratio,
        "judged": False,
    }
    found = judged_trainer(facts)
    if found is None:
        return dict(view, note="no trainer runs")
    leader, status = found
    tree = ((facts.get("current") or {}).get("manifest") or {}).get("tree_sha256")
    if not state_is(status, "stepping"):
        return dict(view, note=f"the trainer is {status.get('state') or 'without status.json'}")
    if status.get("code_tree_sha256") != tree:
        return dict(view, note="the trainer runs another release than current")
    judged, measured, over = _judged_speed(status)
    view.update(
        tokens_per_s=status.get("tokens_per_s"),
        judged_tokens_per_s=judged,
        measured_tokens_per_s=measured,
        cpu_wait=cpu_wait_line(judged, measured),
        window=_window(status),
        windows=status.get("throughput_windows"),
        stages=status.get("stages"),
        slowest_stage=slowest_stage(status.get("stages")),
    )
    for key in ("health_check", "fastest"):
        then = reference_speed(view[key] or {})
        if isinstance(judged, (int, float)) and then:
            view["ratios"][key] = round(judged / then, 3)
            view["bands"][key] = band(min_ratio, view[key])
    age = leader.get("heartbeat_age_s")
    if age is not None and age > heartbeat_max_age:
        return dict(view, note=f"status.json is {age:g} s old (heartbeat_stale): not judged")
    steps, size = view["window"]["steps"], view["window"]["size"]
    if size and steps < size:
        return dict(view, note=f"too early to judge: {steps} of {size} steps measured")
    if judged is None:
        return dict(view, note=over)
    if not view["ratios"]:
        return dict(view, note="no health-check tokens/s recorded for this deployment")
    if min_ratio <= 0:
        return dict(view, note="not judged: dflash_verify_min_throughput_ratio is 0")
    return dict(view, judged=True, note=f"judged over {over}")


def _named(ref: dict) -> str:
    return f"#{ref['number']} {ref['release']}, {ref['time']}"


def throughput_findings(
    facts: dict, min_ratio: float = 0.8, heartbeat_max_age: float = 60
) -> list[dict]:
    """`throughput` when the running trainer's tokens/s is under `min_ratio` of its health
    check or of the fastest healthy deployment of the same layout, shape and data."""
    view = throughput_view(facts, min_ratio, heartbeat_max_age)
    ratios, bands = view["ratios"], view["bands"]
    if not view["judged"] or all(ratio >= bands[key] for key, ratio in ratios.items()):
        return []
    check, fastest = view["health_check"], view["fastest"]
    expected, found = [], []
    if check:
        expected.append(
            f">= {bands['health_check']:g} x {_speed(reference_speed(check))} tokens/s "
            f"(health check of {_named(check)})"
        )
        found.append(f"x{ratios['health_check']:g} of the health check")
    if fastest:
        which = "this deployment" if fastest.get("current") else _named(fastest)
        expected.append(
            f">= {bands['fastest']:g} x {_speed(reference_speed(fastest))} tokens/s "
            f"(fastest of this layout, shape and data: {which})"
        )
        found.append(f"x{ratios['fastest']:g} of the fastest")
    trainer = trainer_summary(facts) or {}
    _, status = judged_trainer(facts) or ({}, {})
    data_moved = length_shift((fastest or check or {}).get("data"), status.get("data"))
    host_changed = (
        "nothing was deployed since it ran fast: look at the host (the gpu finding, other "
        "processes); "
        if fastest and fastest.get("current")
        else ""
    )
    return [
        finding(
            "throughput",
            "; ".join(expected),
            f"{_speed(view['judged_tokens_per_s'])} tokens/s "
            f"{view['note'].removeprefix('judged ')} at step {trainer.get('step')} "
            f"({', '.join(found)})" + (f"; {view['cpu_wait']}" if view.get("cpu_wait") else ""),
            (
                f"{data_moved} (against the {'fastest' if fastest else 'health check'}); "
                if data_moved
                else ""
            )
            + f"{grown_stage(view['stages'], (check or {}).get('stages'))}; {host_changed}"
            f"what changed since the fastest: {DIFF_FASTEST}",
            pid=trainer.get("pid"),
            tokens_per_s=view["judged_tokens_per_s"],
            health_check=check,
            fastest=fastest,
            ratios=ratios,
        )
    ]


def verify_summary(
    facts: dict,
    min_ratio: float = 0.8,
    heartbeat_max_age: float = 60,
    max_cpu_wait: float = MAX_WAIT,
    contention_after: float = AFTER_S,
) -> dict:
    """The per-host figures of the table and the reports: the trainer, its throughput beside
    its references, its wait for a CPU, and what each check could look at (`checks`)."""
    throughput = throughput_view(facts, min_ratio, heartbeat_max_age)
    contention = contention_view(facts, max_cpu_wait, contention_after)
    gpus = judge_facts(facts)
    gpu_check = (
        f"checked GPUs {','.join(map(str, gpus['gpus']))} (pids as seen "
        f"{'here' if gpus['pids'] == 'here' else 'by the node'})"
        if gpus["applies"]
        else f"not applicable: {gpus['why']}"
    )
    return {
        "trainer": trainer_summary(facts),
        "supervision": supervision_view(facts),
        "compile_cache": compile_cache_view(facts),
        "throughput": throughput,
        "contention": contention,
        "gpu": {key: gpus[key] for key in ("applies", "why", "gpus", "pids") if key in gpus},
        "checks": {
            "throughput": throughput["note"],
            "contention": contention["note"],
            "gpu": gpu_check,
        },
    }


def _reference(ref: dict | None, ratio: float | None) -> str:
    if not ref:
        return "-"
    which = "this deployment" if ref.get("current") else f"#{ref['number']} {ref['release']}"
    judged, measured = reference_speed(ref), ref.get("tokens_per_s")
    if isinstance(measured, (int, float)) and judged and measured < WAIT_NOISE * judged:
        which += f", {_speed(measured)} as measured on a busy host"  # judged: the wait left out
    return f"{_speed(judged)} ({which}{f', x{ratio:g}' if ratio else ''})"


def verify_summary_lines(summary: dict) -> list[str]:
    """The trainer, its tokens/s against its health check and the fastest comparable, and the
    checks that could not apply, as lines above the findings table."""
    trainer, speed = summary.get("trainer"), summary["throughput"]
    lines = []
    if trainer:
        lines.append(
            f"trainer: pid {trainer['pid']}, {trainer['state'] or 'no status.json'}, step "
            f"{'-' if trainer['step'] is None else trainer['step']}, "
            f"up {trainer['age_s']} s, status.json {trainer['heartbeat_age_s']} s old"
        )
    supervision = supervision_line(summary.get("supervision"))
    if supervision:
        lines.append(supervision)
    cache = compile_cache_line(summary.get("compile_cache"))
    if cache:
        lines.append(cache)
    slowest = speed.get("slowest_stage")
    lines.append(
        f"tokens/s: now {_speed(speed['tokens_per_s'])} | health check "
        f"{_reference(speed['health_check'], speed['ratios'].get('health_check'))} | fastest "
        f"{_reference(speed['fastest'], speed['ratios'].get('fastest'))} | slowest stage "
        + (f"{slowest['name']} {slowest['seconds']:.3f} s" if slowest else "-")
    )
    if speed.get("cpu_wait"):
        lines.append(speed["cpu_wait"])
    lines.extend(f"check {name}: {text}" for name, text in summary["checks"].items())
    return lines


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_throughput_findings": throughput_findings,
            "dflash_verify_summary": verify_summary,
            "dflash_verify_summary_lines": verify_summary_lines,
        }
