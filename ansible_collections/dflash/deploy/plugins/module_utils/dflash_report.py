# What the report of a target's deployments shows (docs/report.md): every history line with
# its run's figures (tokens/s over the steps, goodput, stage times, compile cache), and for
# every deployment that ran slower than the comparable one before it, what changed from that
# one and from the fastest comparable one (dflash_history.compare). Pure functions over the
# history, for the dflash_report module; the page itself is drawn on the controller.
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_history import (
    compare,
    listing,
    text_diff,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    comparable_indexes,
    fastest_of,
    rated,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    reference_speed as speed,
)

# A trainer's step line in train.log (dflash/train.py): `<utc time> step N loss L tokens/s T`.
STEP_LINE = re.compile(r"^(\S+) step (\d+) loss \S+ tokens/s (\d+(?:\.\d+)?)")
# The line a trainer logs just before its loop (dflash/resume.py): the step line after it
# timed the compilation of a fresh process, not training, so it is left out of the series.
LOOP_START = re.compile(r" (resumed from |no checkpoint in |initialised the drafter from )")
# At most this many points of a run's steps: a long run is drawn from a sample of its lines.
SERIES_POINTS = 120


def step_series(lines: Iterable[str], points: int = SERIES_POINTS) -> list[dict]:
    """tokens/s over a run's steps, from its train.log: {time, step, tokens_per_s}, at most
    `points` of them spread evenly over the run (the newest always kept)."""
    found: list[dict] = []
    starting = False
    for line in lines:
        if LOOP_START.search(line):
            starting = True
            continue
        match = STEP_LINE.match(line)
        if not match:
            continue
        if not starting:
            found.append({"time": match[1], "step": int(match[2]), "tokens_per_s": float(match[3])})
        starting = False
    if len(found) <= points:
        return found
    stride = -(-len(found) // points)  # ceil: never more than `points`
    sample = found[::stride]
    return sample if sample[-1] is found[-1] else [*sample[:-1], found[-1]]


def drop_candidates(history: list[dict], min_ratio: float) -> list[tuple[int, int]]:
    """(index, reference index) of each healthy deployment whose tokens/s is under
    `min_ratio` of the newest comparable (same layout, shape and data) healthy deployment before
    it. The controller keeps those under verify's band (dflash_verify.band), which is never
    above `min_ratio`, so this is every drop and maybe a few more."""
    found = []
    for index, entry in enumerate(history):
        if not rated(entry):
            continue
        before = [i for i in comparable_indexes(history, entry) if i < index]
        if before and speed(entry) < min_ratio * speed(history[before[-1]]):
            found.append((index, before[-1]))
    return found


def _run_figures(run: dict | None) -> dict:
    """A deployment's run as its folder holds it: goodput, restarts, compile cache, steps."""
    run = run or {}
    supervisor = run.get("supervisor") or {}
    cache = (run.get("status") or {}).get("compile_cache") or {}
    return {
        "goodput": supervisor.get("goodput"),
        "restarts": (supervisor.get("restarts") or {}).get("count"),
        "compile_cache": {k: cache.get(k) for k in ("fingerprint", "started_warm", "first_step_s")}
        if cache
        else None,
        "series": run.get("series") or [],
    }


def changes(
    history: list[dict],
    old: int,
    new: int,
    manifests: dict[str, dict],
    read: Callable[[str, str], bytes | None],
) -> dict:
    """What changed from deployment `old` to `new` as diff.yml shows it, and the lines of
    run.sh that differ (its values are in `changes`; the text shows the lines as written)."""
    found = compare(history, old, new, manifests, read)
    texts = [(history[i].get("run_sh_text") or "").encode() for i in (old, new)]
    found["run_sh_text"] = text_diff("run.sh", *texts) if texts[0] != texts[1] else None
    return found


def report_data(
    history: list[dict],
    manifests: dict[str, dict],
    read: Callable[[str, str], bytes | None],
    runs: dict[str, dict],
    min_ratio: float,
) -> dict:
    """Every history line as history.yml lists it, with its health check's stages and step
    spread and its run's figures (`runs`: {run id: {supervisor, status, series}}), and the
    drop candidates with what changed (`previous`: from the reference; `fastest`: from the
    fastest comparable deployment before it, when that is another one)."""
    rows = listing(history)
    for row, entry in zip(rows, history, strict=True):
        row.update(
            stages=entry.get("stages"),
            step_spread=entry.get("step_spread"),
            rolled_back_to=entry.get("rolled_back_to"),
            run_id=entry.get("run_id"),
            **_run_figures(runs.get(entry.get("run_id") or "")),
        )
    drops = []
    for index, ref in drop_candidates(history, min_ratio):
        before = [i for i in comparable_indexes(history, history[index]) if i < index]
        fastest = fastest_of(history, before)
        drops.append(
            {
                "number": index + 1,
                "reference": ref + 1,
                "ratio": round(speed(history[index]) / speed(history[ref]), 3),
                "reference_step_spread": history[ref].get("step_spread"),
                "previous": changes(history, ref, index, manifests, read),
                "fastest": None
                if fastest in (None, ref)
                else changes(history, fastest, index, manifests, read),
            }
        )
    return {"deployments": rows, "drops": drops}
