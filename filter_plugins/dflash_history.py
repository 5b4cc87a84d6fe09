# Controller-side filters: the readable tables of history.yml and diff.yml, where a failed
# launch goes back to, and what the deploy's throughput gate compares with.
from __future__ import annotations

from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import DEPLOY_ACTIONS
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_settings import (
    setting_changes,
    settings_text,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    gate_baseline,
    shape_of,
)


def _short(value: Any, width: int = 12) -> str:
    return "-" if value in (None, "") else str(value)[:width]


def _layout(layout: dict | None) -> str:
    if not layout:
        return "-"
    if layout.get("mode") == "cpu":
        return "cpu"
    target = ",".join(map(str, layout.get("target") or []))
    drafter = ",".join(map(str, layout.get("drafter") or []))
    return f"{layout.get('mode')} t{target} d{drafter}"


def _speed(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "-"


def _goodput(row: dict) -> str:
    """`97.2% (1 restart)` of a deployment's run, as its supervisor recorded it."""
    ratio = (row.get("goodput") or {}).get("ratio")
    if ratio is None:
        return "-"
    count = row.get("restarts") or 0
    return f"{ratio * 100:.1f}%" + (f" ({count} restart{'s' * (count != 1)})" if count else "")


def _result(row: dict) -> str:
    """How it ended; for the supervisor's restart lines also why, and the steps lost."""
    result = _short(row.get("result"))
    if row.get("result") == "interrupted":
        return f"interrupted ({row.get('phase') or '?'})"
    if row.get("action") != "restart":
        return result
    lost = row.get("steps_lost")
    return f"{result} ({row.get('reason')}" + (f", {lost} steps lost)" if lost else ")")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def history_lines(deployments: list[dict]) -> list[str]:
    """One line per deployment: what ran, how it ended and how fast it trained."""
    if not deployments:
        return ["no deployments recorded"]
    header = ["#", "time", "action", "release", "tree", "lock", "layout", "data", "result",
              "tokens/s", "goodput"]  # fmt: skip
    rows = [
        [
            str(d["number"]),
            _short(d.get("time"), 19),
            "repair" if d.get("repaired") else _short(d.get("action")),
            _short(d.get("release"), 24),
            _short(d.get("tree_sha256")),
            _short(d.get("lock_id")),
            _layout(d.get("layout")),
            _short(d.get("data")),
            _result(d),
            _speed(d.get("tokens_per_s")),
            _goodput(d),
        ]
        for d in deployments
    ]
    repairs = [f"#{d['number']} repaired: {'; '.join(d['repaired'])}"
               for d in deployments if d.get("repaired")]  # fmt: skip
    busy = [f"#{d['number']} {_speed(d['tokens_per_s'])} tokens/s with the trainer's wait for a "
            f"CPU left out ({_speed(d['measured_tokens_per_s'])} as measured on a busy host)"
            for d in deployments if d.get("measured_tokens_per_s")]  # fmt: skip
    return _table(header, rows) + repairs + busy


def _side(summary: dict) -> str:
    measured = summary.get("measured_tokens_per_s")
    return (
        f"#{summary['number']} {summary.get('action')} {summary.get('release')} "
        f"({summary.get('result')}, {summary.get('time')}, {_speed(summary.get('tokens_per_s'))} "
        "tokens/s" + (f", {_speed(measured)} as measured on a busy host" if measured else "") + ")"
    )


def diff_lines(diff: dict) -> list[str]:
    """The diff of two deployments: a table of changed values, file names, then text diffs."""
    lines = [f"from {_side(diff['from'])}", f"to   {_side(diff['to'])}"]
    files = diff["files"]
    if not files["known"]:
        lines.append("files: not compared (a release is no longer on the target)")
    for kind in ("added", "removed", "changed"):
        lines.extend(f"file {kind}: {path}" for path in files[kind])
    rows = [
        [c["section"], c["name"], _short(c["from"], 40), _short(c["to"], 40)]
        for c in diff["changes"]
    ]
    speed = diff["throughput"]
    ratio = f" (x{speed['ratio']})" if speed.get("ratio") is not None else ""
    rows.append(["throughput", "tokens/s", _speed(speed["from"]), _speed(speed["to"]) + ratio])
    restarts = diff.get("restarts") or {}
    if restarts.get("from") or restarts.get("to"):
        cells = []
        for side in ("from", "to"):
            seen = restarts.get(side) or []
            cells.append(f"{len(seen)}" + (f", last {seen[-1]}" if seen else ""))
        rows.append(["supervision", "restarts", *cells])
    lines.extend(_table(["section", "name", "from", "to"], rows))
    for _path, text in sorted(files["text"].items()):
        lines.extend(text.rstrip("\n").split("\n"))
    if not files["added"] + files["removed"] + files["changed"] and not diff["changes"]:
        lines.append("same code, environment, run.sh values, GPU layout and data")
    return lines


def restore_target(
    history: list[dict],
    releases: list[str],
    current: str | None,
    failed_release: str,
    failed_run_sh_sha256: str,
) -> dict:
    """What a failed launch goes back to: the newest healthy deployment whose release is still
    on the target and that is not the very thing that failed (same release and run.sh); else
    what was current, as its newest good line recorded it; else {} (nothing to go back to).
    When what failed is exactly what was current, nothing is: an older deployment is not
    swapped in for a failure that no change made (rollback.yml does that when asked)."""

    def tried(entry: dict) -> bool:
        return (entry.get("release"), entry.get("run_sh_sha256")) == (
            failed_release,
            failed_run_sh_sha256,
        )

    now = next(
        (e for e in reversed(history)
         if e.get("release") == current and e.get("result") in ("healthy", "deployed")),
        None,
    )  # fmt: skip
    if now is not None and tried(now):
        return {}

    for entry in reversed(history):
        healthy = entry.get("result") == "healthy" and entry.get("release") in releases
        if healthy and not tried(entry):
            return entry
    if not current:
        return {}
    for entry in reversed(history):
        if entry.get("release") == current and entry.get("result") in ("healthy", "deployed"):
            return {} if tried(entry) else entry
    # No line for it (state from before history): the release alone, with the run.sh on disk.
    return {} if current == failed_release else {"release": current}


def interrupted_run(lock: dict | None) -> dict | None:
    """What the run whose deploy lock this one took over was doing, for this run's history
    line; None when it took over no deploy or rollback."""
    if not lock or lock.get("action") not in DEPLOY_ACTIONS:
        return None
    return {key: lock.get(key) for key in ("action", "release", "from_release", "phase", "started")}


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_history_lines": history_lines,
            "dflash_diff_lines": diff_lines,
            "dflash_restore_target": restore_target,
            "dflash_gate_baseline": gate_baseline,
            "dflash_step_shape": shape_of,
            "dflash_interrupted_run": interrupted_run,
            "dflash_setting_changes": setting_changes,
            "dflash_settings_text": settings_text,
        }
