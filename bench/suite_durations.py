"""Where the test suite's time goes: a table from pytest's JUnit XML and `--durations=0` output.

    pytest -n 2 --durations=0 --junitxml=suite.xml ... > suite.log
    python bench/suite_durations.py suite.xml suite.log [--top 25]

Prints, as Markdown (docs/development.md keeps one before and after a change): the totals (tests,
passed, failed, skipped, worker-seconds, CPU-s), the seconds and CPU-s of each test file (setup +
call + teardown, summed over its tests; the CPU-s are the `cpu_s` property tests/conftest.py
writes: the pytest worker and the playbooks and modules it waited for, not a launched trainer),
the slowest tests, and the slowest set-ups. A session fixture's set-up
is charged to the first test that asked for it, so a large set-up line names the fixture's cost.
"""

from __future__ import annotations

import argparse
import json
import re
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

# `12.34s setup    tests/unit/test_x.py::test_y[param]`
DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?P<phase>setup|call|teardown)\s+(?P<test>\S.*)$")
WALL = re.compile(r"= .* in (?P<seconds>[\d.]+)s")


def phases(log_text: str) -> dict[str, dict[str, float]]:
    """{test id: {phase: seconds}} from pytest's --durations=0 lines."""
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for line in log_text.splitlines():
        match = DURATION.match(line.strip())
        if match:
            found[match["test"]][match["phase"]] = float(match["seconds"])
    return found


def outcomes(junit: Path) -> dict[str, str]:
    """{test id: passed|failed|error|skipped} from the JUnit report."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        test = f"{path}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[test] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
    return {test: {"failure": "failed"}.get(kind, kind) for test, kind in found.items()}


def junit_seconds(junit: Path) -> dict[str, float]:
    """{test id: seconds, set-up to teardown} from the JUnit report (its `time`)."""
    return {
        f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}": float(
            case.get("time", 0)
        )
        for case in ElementTree.parse(junit).getroot().iter("testcase")
    }


def cpu_seconds(junit: Path) -> dict[str, float]:
    """{test id: CPU-s} from the `cpu_s` property of each test case (absent: 0)."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        found[test] = sum(
            float(prop.get("value", 0)) for prop in case.iter("property")
            if prop.get("name") == "cpu_s"
        )  # fmt: skip
    return found


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def report(junit: Path, log: Path, top: int) -> str:
    times = phases(log.read_text())
    # A test under --durations=N's cut: its whole time from the JUnit report, as `call`.
    for test, seconds in junit_seconds(junit).items():
        times.setdefault(test, {"call": seconds})
    results = outcomes(junit)
    cpu = cpu_seconds(junit)
    counts: dict[str, int] = defaultdict(int)
    for kind in results.values():
        counts[kind] += 1
    total = sum(sum(p.values()) for p in times.values())
    wall = WALL.findall(log.read_text())
    by_file: dict[str, float] = defaultdict(float)
    cpu_by_file: dict[str, float] = defaultdict(float)
    tests_in_file: dict[str, int] = defaultdict(int)
    for test, phase in times.items():
        by_file[test.split("::")[0]] += sum(phase.values())
        tests_in_file[test.split("::")[0]] += 1
    for test, seconds in cpu.items():
        cpu_by_file[test.split("::")[0]] += seconds
    out = [
        f"{len(results)} tests: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors, {counts['skipped']} skipped; {total:.0f} worker-seconds, "
        f"{sum(cpu.values()):.0f} CPU-s in pytest and what it waited for"
        + (f", {float(wall[-1]):.0f} s wall" if wall else ""),
        "",
        table(
            [
                (
                    name,
                    str(tests_in_file[name]),
                    f"{seconds:.0f}",
                    f"{100 * seconds / total:.1f}%",
                    f"{cpu_by_file[name]:.0f}",
                )
                for name, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]
            ],
            ("file", "tests", "seconds", "share", "CPU-s"),
        ),
        "",
        table(
            [
                (
                    test,
                    f"{p.get('setup', 0):.1f}",
                    f"{p.get('call', 0):.1f}",
                    f"{p.get('teardown', 0):.1f}",
                )
                for test, p in sorted(times.items(), key=lambda kv: -sum(kv[1].values()))[:top]
            ],
            ("slowest tests", "setup", "call", "teardown"),
        ),
        "",
        table(
            [
                (test, f"{p['setup']:.1f}")
                for test, p in sorted(times.items(), key=lambda kv: -kv[1].get("setup", 0))[:10]
                if p.get("setup", 0) >= 1
            ],
            ("slowest set-ups (a session fixture is charged to its first test)", "seconds"),
        ),
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="pytest's --junitxml report")
    parser.add_argument("log", type=Path, help="pytest's output with --durations=0")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    parser.add_argument(
        "--write-seconds", type=Path, metavar="JSON",
        help="also write the seconds of every test of 1 s or more (tests/durations.json: the "
        "order in which make test hands out the work, the longest first)",
    )  # fmt: skip
    args = parser.parse_args()
    print(report(args.junit, args.log, args.top))
    if args.write_seconds:
        long = {test: round(t) for test, t in sorted(junit_seconds(args.junit).items()) if t >= 1}
        args.write_seconds.write_text(json.dumps(long, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
