"""The soak's ledger (bench/soak.py): what was injected when, what the toolkit said about it
and when, and the checks run over it afterwards, as Jepsen checks a history.

Standard library only. A ledger is JSON: {"seed", "duration_s", "every_s", "started",
"faults": [...], "audits": [...], "history": [lines], "goodput": {run id: the goodput of its
supervisor.json}, "end": {...}}; each fault
{"kind", "at", "bound_s", "expects" (the findings a verify may show until it is recovered),
"detected": {"at", "by"} | null, "recovered": {"at", "how"} | null, ...its own figures}; each
audit {"from", "at" (its start and end), "rc", "verdict", "findings": [kind], "in_progress":
[kind of the findings that say a run is in progress], "open_faults": [{"kind", "expects"} of the
faults open at any moment of it], "beside": [the soak's own runs at any moment of it]}; each run
{"name", "from", "to"}.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_span(text: str) -> float:
    """Seconds of `300`, `20s`, `5m`, `1h`, `3d`; a ValueError naming the bad text otherwise."""
    found = SPAN.match(str(text))
    if not found or float(found[1]) <= 0:
        raise ValueError(
            f"{text!r} is no time span: seconds (300) or a number with a unit (20s, 5m, 1h, 3d)"
        )
    return float(found[1]) * UNITS[found[2] or "s"]


def schedule(seed: int, duration: float, every: float, kinds: Sequence[str]) -> list[tuple]:
    """(seconds from the start, fault kind) for each fault: one every `every` seconds, from
    `every` on, each drawn from `kinds` by the seeded generator; the same seed, the same list."""
    draw = random.Random(seed)
    count = int(duration // every)
    return [(round(every * (i + 1), 3), draw.choice(list(kinds))) for i in range(count)]


def false_alarms(audits: list[dict]) -> list[dict]:
    """Audits that reported drift with no fault open and no run of the soak's beside them, or a
    finding that neither explains: an open fault's expected findings, or a run said to be in
    progress while one of the soak's was."""
    wrong = []
    for audit in audits:
        allowed = {kind for fault in audit.get("open_faults", []) for kind in fault["expects"]}
        if audit.get("beside"):
            allowed.update(audit.get("in_progress", []))
        unexplained = [kind for kind in audit["findings"] if kind not in allowed]
        quiet = not audit.get("open_faults") and not audit.get("beside")
        if unexplained or (audit["verdict"] != "ok" and quiet):
            wrong.append({**audit, "unexplained": unexplained})
    return wrong


def history_problems(lines: list[str]) -> list[str]:
    """Lines of history.jsonl that do not parse, and deployments recorded twice (one run id in
    two deploy or rollback lines)."""
    problems, seen = [], {}
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(f"history line {number} is no JSON record: {line[:80]!r}")
            continue
        if record.get("action") in ("deploy", "rollback") and record.get("run_id"):
            if record["run_id"] in seen:
                problems.append(
                    f"history lines {seen[record['run_id']]} and {number} record one "
                    f"deployment ({record['run_id']}) twice"
                )
            seen[record["run_id"]] = number
    return problems


def goodput_problem(goodput: dict[str, Any]) -> str | None:
    """None when the run's goodput parts add up to its wall time (within 1 s)."""
    if not goodput:
        return "no goodput record"
    parts = goodput["productive_s"] + sum(goodput["badput_s"].values())
    if abs(parts - goodput["wall_s"]) > 1.0 or min(goodput["badput_s"].values(), default=0) < 0:
        return f"goodput parts {parts:.1f} s against a wall of {goodput['wall_s']:.1f} s: {goodput}"
    return None


def fault_problems(faults: list[dict]) -> list[str]:
    """Faults not detected or not recovered within their bound, and restart figures that
    disagree with the ledger's own."""
    problems = []
    for fault in faults:
        name = f"{fault['kind']} at {fault['at']:.0f} s"
        for phase in ("detected", "recovered"):
            done = fault.get(phase)
            if done is None:
                problems.append(f"{name}: not {phase} ({fault.get('why', 'no reason known')})")
            elif done["at"] - fault["at"] > fault["bound_s"]:
                problems.append(
                    f"{name}: {phase} after {done['at'] - fault['at']:.0f} s, over its bound of "
                    f"{fault['bound_s']:.0f} s"
                )
        line = fault.get("restart_line")
        if line and "step_at_kill" in fault:
            # The trainer may have stepped once more after the soak's last look before the kill.
            seen_lost = fault["step_at_kill"] - line["resumed_from_step"]
            if not seen_lost <= line["steps_lost"] <= seen_lost + fault.get("step_slack", 2):
                problems.append(
                    f"{name}: the restart line says {line['steps_lost']} steps lost, the ledger "
                    f"saw {seen_lost} (step {fault['step_at_kill']} at the kill, resumed from "
                    f"{line['resumed_from_step']})"
                )
        first = fault.get("first_step_wall")
        if line and fault["kind"] == "kill_trainer" and first and line.get("time_to_first_step_s"):
            # Time down, the kill to the first step: the supervisor's figure against the ledger's
            # (the kill's own clock, the step's time in train.log), within a second.
            seen = first - fault["killed_wall"]
            if abs(seen - line["time_to_first_step_s"]) > 1.0:
                problems.append(
                    f"{name}: the restart line says {line['time_to_first_step_s']} s from the end "
                    f"to the first step, the ledger saw {seen:.1f} s from the kill"
                )
        if line and line["resumed_from_step"] < fault.get("checkpoint_at_kill", 0):
            problems.append(
                f"{name}: resumed from step {line['resumed_from_step']}, before the newest "
                f"checkpoint {fault['checkpoint_at_kill']} at the kill"
            )
    return problems


def check(ledger: dict[str, Any]) -> list[str]:
    """Every problem the ledger shows; none means the soak passed."""
    problems = fault_problems(ledger["faults"])
    problems += history_problems(ledger.get("history", []))
    for audit in false_alarms(ledger["audits"]):
        problems.append(
            f"false alarm at {audit['at']:.0f} s: verify said {audit['verdict']} "
            f"({', '.join(audit['findings']) or 'no finding'}), unexplained "
            f"{audit['unexplained'] or 'with no fault open'}"
        )
    for run_id, goodput in ledger.get("goodput", {}).items():
        if problem := goodput_problem(goodput):
            problems.append(f"run {run_id}: {problem}")
    end = ledger.get("end", {})
    if end.get("verdict") != "ok" or not end.get("stepping"):
        problems.append(f"the end: {end}")
    return problems


def summary(ledger: dict[str, Any]) -> str:
    """A Markdown table of the faults by kind: injected, detected and recovered within bound,
    the median seconds to each."""
    rows = ["| fault | injected | detected | recovered | median s to detect / recover |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for kind in sorted({fault["kind"] for fault in ledger["faults"]}):
        mine = [fault for fault in ledger["faults"] if fault["kind"] == kind]

        def within(phase: str, faults: list[dict] = mine) -> list[float]:
            return sorted(
                f[phase]["at"] - f["at"] for f in faults
                if f.get(phase) and f[phase]["at"] - f["at"] <= f["bound_s"]
            )  # fmt: skip

        detected, recovered = within("detected"), within("recovered")
        median = "/".join(
            f"{values[len(values) // 2]:.0f}" if values else "-" for values in (detected, recovered)
        )
        rows.append(f"| {kind} | {len(mine)} | {len(detected)} | {len(recovered)} | {median} |")
    audits = ledger["audits"]
    rows.append(
        f"\n{len(audits)} audits, {len(false_alarms(audits))} false alarms; "
        f"{len(ledger.get('history', []))} history lines"
    )
    return "\n".join(rows)
