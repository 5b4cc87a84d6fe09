"""What the soak reads of the state root it runs against (bench/soak.py): the trainer's
status, history.jsonl's lines and records, and whether a trainer steps."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from dflash.supervision.states import state_is
from tests.integration.conftest import read_json


class Target:
    def __init__(self, root: Path) -> None:
        self.root = root

    def status(self) -> dict[str, Any]:
        return read_json(self.root / "runs" / "latest" / "status.json") or {}

    def history(self) -> list[str]:
        try:
            return (self.root / "history.jsonl").read_text().splitlines()
        except OSError:
            return []

    def records(self, after: int = 0) -> list[dict[str, Any]]:
        """The history lines after the first `after` that parse (a torn one does not)."""
        found = []
        for line in self.history()[after:]:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def restart_lines(self, after: int) -> list[dict[str, Any]]:
        return [record for record in self.records(after) if record.get("action") == "restart"]

    def previous_release(self) -> str | None:
        """The release rollback.yml goes back to, as docs/rollback.md says: the newest healthy
        (or staged) deployment of another release than the current one."""
        current = (self.root / "current").resolve().name
        for record in reversed(self.records()):
            good = record.get("result") in ("healthy", "deployed")
            if good and record.get("release") != current and record.get("action") in (
                "deploy", "rollback"):  # fmt: skip
                return record["release"]
        return None

    def saving(self, within_s: float) -> dict[str, Any] | None:
        """status.json of a trainer caught inside a checkpoint save within `within_s`, or None."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            status = self.status()
            pid = status.get("pid")
            if state_is(status, "saving") and pid and os.path.exists(f"/proc/{pid}"):
                return status
            time.sleep(0.05)
        return None

    def stepping(self, attempt_over: int = -1, release: str | None = None) -> bool:
        status = self.status()
        pid = status.get("pid")
        return (
            state_is(status, "steps_due")
            and status.get("attempt", 0) > attempt_over
            and status.get("step", 0) > (status.get("resumed_from_step") or 0)
            and (release is None or status.get("release") == release)
            and bool(pid) and os.path.exists(f"/proc/{pid}")
        )  # fmt: skip

    def first_step_after(self, wall: float) -> float | None:
        """When the trainer logged its first step after `wall` (epoch seconds): every start logs
        its first step, with the time it was made (`<ISO time> step N ...` in train.log)."""
        try:
            lines = (self.root / "runs" / "latest" / "train.log").read_text(errors="replace")
        except OSError:
            return None
        for line in lines.splitlines():
            stamp, _, text = line.partition(" ")
            if not text.startswith("step "):
                continue
            try:
                at = datetime.fromisoformat(stamp).timestamp()
            except ValueError:
                continue
            if at > wall:
                return at
        return None
