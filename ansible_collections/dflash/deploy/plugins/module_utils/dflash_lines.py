# What a history.jsonl line says about the deployment (docs/history-diff.md).
# Standard library only: the controller's filters use it as well as the target's modules.
from __future__ import annotations

# Results after which a release may serve as a rollback target.
GOOD_RESULTS = ("healthy", "deployed")
# Actions that make a release current (other lines, e.g. an export, leave current alone).
DEPLOY_ACTIONS = ("deploy", "rollback")
# The line of a deploy or rollback whose lock a later run took over: its intent, no code.
INTERRUPTED = "interrupted"


def records_code(entry: dict) -> bool:
    """A deploy or rollback line that says what code arrived (not an interrupted one's)."""
    return entry.get("action", "deploy") in DEPLOY_ACTIONS and entry.get("result") != INTERRUPTED


def last_deployment(history: list[dict]) -> dict | None:
    """The newest line that made something current (a good deploy or rollback)."""
    for entry in reversed(history):
        if entry.get("action", "deploy") in DEPLOY_ACTIONS and entry.get("result") in GOOD_RESULTS:
            return entry
    return None
