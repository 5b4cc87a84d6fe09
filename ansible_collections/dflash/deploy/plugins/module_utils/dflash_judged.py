# Which trainer of a target verify judges, from what dflash_facts read: shared by the filters of
# its findings (speed, contention) and its summary.
from __future__ import annotations


def judged_trainer(facts: dict) -> tuple[dict, dict] | None:
    """The leader and status of the trainer to judge: the one trainer.json names, else the
    first with a status file (several at once are the duplicate_trainer finding)."""
    groups: dict[int, list[dict]] = {}
    for proc in (facts.get("trainers") or {}).get("processes") or []:
        groups.setdefault(proc.get("job", proc["pid"]), []).append(proc)
    run_id = ((facts.get("trainers") or {}).get("record") or {}).get("run_id")
    chosen = None
    for group in groups.values():
        status = next((p["status"] for p in group if p.get("status")), None)
        if status and (chosen is None or status.get("run_id") == run_id):
            chosen = (min(group, key=lambda p: p["pid"]), status)
    if chosen is None and groups:
        chosen = (min(next(iter(groups.values())), key=lambda p: p["pid"]), {})
    return chosen
