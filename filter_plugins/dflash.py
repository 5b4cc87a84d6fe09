# Controller-side filters: verify findings from a facts document (DESIGN.md "Verify report"),
# and the release-name and lock checks that preflight runs before anything changes.
from __future__ import annotations

import os
import sys
from typing import Any

# The naming rules live with the modules' shared code; filters run on the controller.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
)
from dflash_layout import LayoutError, gpu_layout, trainer_env, trainer_flags
from dflash_lock import lock_id, lock_problems
from dflash_release import release_id_problem


def finding(kind: str, expected: Any, found: Any, hint: str, **extra: Any) -> dict:
    return {"kind": kind, "expected": expected, "found": found, "hint": hint, **extra}


def release_findings(facts: dict) -> list[dict]:
    current = facts.get("current") or {}
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
        return [finding("release", "a current release", "no current link", "run deploy.yml")]
    found: list[dict] = []
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
    recorded = [e for e in facts.get("history", []) if e.get("release") == release]
    if recorded and recorded[-1].get("tree_sha256") != manifest.get("tree_sha256"):
        found.append(
            finding(
                "release",
                recorded[-1].get("tree_sha256"),
                manifest.get("tree_sha256"),
                f"release {release} differs from what history recorded; redeploy it",
            )
        )
    if facts.get("history") and facts["history"][-1].get("release") != release:
        found.append(
            finding(
                "release",
                facts["history"][-1].get("release"),
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
                    f"redeploy release {release} (deploy.yml -e dflash_ref=...) or roll back",
                    path=path,
                    state=state,
                )
            )
    return out


def dflash_findings(facts: dict) -> list[dict]:
    """Every drift in one target's facts document; an empty list means the target is clean."""
    return release_findings(facts) + code_findings(facts)


def dflash_report_lines(findings: list[dict]) -> list[str]:
    """A readable table: one line per finding."""
    if not findings:
        return ["OK: no drift"]
    lines = [f"{'KIND':<18} {'WHAT':<34} {'EXPECTED':<32} FOUND"]
    for item in findings:
        what = item.get("path", "")
        lines.append(f"{item['kind']:<18} {what:<34} {item['expected']!s:<32} {item['found']}")
        lines.append(f"{'':<18} fix: {item['hint']}")
    return lines


def dflash_run_spec(data: dict) -> dict:
    """What run.sh will say, validated: GPU layout, trainer flags (one [flag, value?] group
    per line of run.sh) and environment; `problems` lists every bad input, each naming the
    value and the fix."""
    spec: dict = {"problems": []}
    checks = {
        "layout": lambda: gpu_layout(
            data.get("target_gpus"), data.get("drafter_gpus"), bool(data.get("colocated")),
            data.get("visible"),
        ),
        "flags": lambda: trainer_flags(data.get("args") or {}),
        "env": lambda: trainer_env(data.get("env") or {}),
    }  # fmt: skip
    for key, check in checks.items():
        try:
            spec[key] = check()
        except LayoutError as err:
            spec["problems"].append(str(err))
    return spec


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_findings": dflash_findings,
            "dflash_report_lines": dflash_report_lines,
            "dflash_release_problem": release_id_problem,
            "dflash_lock_problems": lock_problems,
            "dflash_lock_id": lock_id,
            "dflash_run_spec": dflash_run_spec,
        }
