"""The supervisor's rules and its record of a run (dflash.supervise runs the processes).

`Policy`: when to restart (a window, a back-off) and when a trainer hangs. `RunRecord`: each
start of the trainer (an attempt) with what its status.json said, each restart, the run's
state, and what it writes: supervisor.json in the run folder (rewritten atomically; goodput from
dflash.supervision.goodput) and one `restart` line per restart in the state root's history.jsonl.
Its files are written by dflash.supervision.files, which a full disk cannot kill. Standard
library only.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflash.checkpoint_names import newest_step
from dflash.supervision.files import append_line, log, read_status, utc_text, write_atomic
from dflash.supervision.goodput import epoch, goodput
from dflash.supervision.restart_facts import compiled_entry, last_error, log_size
from dflash.supervision.states import SUPERVISOR_STATES, state_fields, state_is

SUPERVISOR_FILE = "supervisor.json"
HISTORY_FILE = "history.jsonl"
HANG_FLOOR_S = 300.0  # the automatic hang limit is never shorter (a slow step, a recompile)
HANG_STEPS = 10  # ... nor shorter than this many median steps
SAVE_FLOOR_S = 900.0  # a checkpoint save is hung after this with hang_after auto (slow storage)
SAVE_TIMES = 10  # ... and never sooner than this many times the run's longest save
# The fields of a restart's history.jsonl line (README "Supervision").
RESTART_FIELDS = (
    "reason", "exit", "step", "checkpoint_step", "steps_lost", "down_s",
    "time_to_first_step_s", "resumed_from_step", "restarts_in_window", "error",
    "compiled_entry", "cache_damaged", "cache_moved_aside",
)  # fmt: skip
# The exit code of a trainer whose compile cache failed its canary (dflash.compile_watch), and
# of a warmup whose compiled step disagrees with the eager one: the cache is suspect.
CACHE_SUSPECT_EXIT = 3
# torchrun exits 1 whatever its workers' exit codes: under it, status.json says what happened.
TORCHRUN_FAILED_EXIT = 1
CANARY_FAILED = "compile cache failed its canary"  # a restart's reason starts so


@dataclass(frozen=True)
class Policy:
    max_restarts: int  # within `window_s`; 0 turns restarts off (a crash ends the run)
    window_s: float
    backoff_s: float
    backoff_max_s: float
    hang_after_s: float | None  # None: max(10 median steps, 5 min)

    def hang_limit(self, status: dict[str, Any]) -> float:
        if self.hang_after_s is not None:
            return self.hang_after_s
        median = status.get("step_s_median") or 0.0
        return max(HANG_STEPS * median, HANG_FLOOR_S)

    def save_limit(self, longest_save_s: float) -> float:
        """How long a checkpoint save may run before the trainer is hung: the hang limit given
        (auto: SAVE_FLOOR_S), or SAVE_TIMES the run's longest save so far if longer."""
        floor = SAVE_FLOOR_S if self.hang_after_s is None else self.hang_after_s
        return max(floor, SAVE_TIMES * longest_save_s)

    def backoff(self, failures: int) -> float:
        """The wait before a restart after `failures` quick failures in a row (1: the first)."""
        return min(self.backoff_s * 2 ** max(0, failures - 1), self.backoff_max_s)


def how_ended(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class RunRecord:
    """What happened to one run: its attempts and restarts, kept in supervisor.json."""

    def __init__(
        self,
        policy: Policy,
        root: Path,
        run_id: str,
        checkpoints: Path | None = None,
        release: str | None = None,
        cache: Path | None = None,
    ) -> None:
        self.policy = policy
        self.root = root
        self.run_id = run_id
        # Read when a restart is recorded: the trainer that ended may not have said them.
        self.checkpoints = checkpoints
        self.release = release
        self.cache = cache  # the compile cache folder run.sh named (TORCHINDUCTOR_CACHE_DIR)
        self.run_dir = root / "runs" / run_id
        self.status_path = self.run_dir / "status.json"
        self.log_path = self.run_dir / "train.log"
        self.state_path = self.run_dir / SUPERVISOR_FILE
        self.started = time.time()
        self.attempts: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []
        self.state = "starting"
        self.last_error: str | None = None
        self.longest_save_s = 0.0  # of every attempt's checkpoint saves: the save limit's base
        # When a back-off ends and the next start is made (epoch s; None outside one).
        self.backoff_until: float | None = None

    def begin(self) -> dict[str, Any]:
        """A new attempt (a start of the trainer)."""
        # Where its output starts in train.log: an error found later is its own.
        at = log_size(self.log_path)
        self.attempts.append({"attempt": len(self.attempts), "started": time.time(), "log_at": at})
        self.state = "running"
        return self.attempts[-1]

    def end(self, code: int, reason: str) -> None:
        """The current attempt ended: `crash`, `hung`, `stopped` or `finished`."""
        attempt = self.attempts[-1]
        attempt.update(ended=time.time(), exit=code, end_reason=reason)
        if reason != "hung":  # what a hung trainer did once continued for its dump: not counted
            self.observe(read_status(self.status_path))
        else:  # ... but a checkpoint it wrote then is kept work: the restart resumes from it
            self.keep_dump_window_checkpoint(read_status(self.status_path))
        if reason in ("crash", "hung"):
            self.mark_failed(attempt, code, "hung" if reason == "hung" else how_ended(code))
        self.finish_restart_line(attempt)

    def observe(self, status: dict[str, Any]) -> None:
        """Copy what status.json says of the current attempt (only its own: a status.json left by
        the attempt before has another `attempt`)."""
        attempt = self.attempts[-1]
        if status.get("attempt", 0) != attempt["attempt"]:
            return
        copied = (
            "first_step_at", "last_step_at", "step", "checkpoint_seconds", "error", "compile_cache"
        )  # fmt: skip
        for key in copied:
            attempt[key] = status.get(key)
        attempt["resumed_from_step"] = status.get("resumed_from_step") or 0
        self.longest_save_s = max(self.longest_save_s, status.get("checkpoint_save_s") or 0.0)
        saved = status.get("checkpoint") or {}
        attempt["checkpoint_step"] = saved.get("step") or 0
        attempt["checkpoint_at"] = saved.get("at")  # only a checkpoint this attempt saved
        self.finish_restart_line(attempt)

    def keep_dump_window_checkpoint(self, status: dict[str, Any]) -> None:
        """A hung trainer continued for its stack dump may finish its step and save a checkpoint
        before the kill: the steps up to it were not lost (goodput clamps it to the last step
        seen before the hang, so the hang's own time stays the hang's)."""
        attempt = self.attempts[-1]
        saved = status.get("checkpoint") or {}
        if status.get("attempt", 0) != attempt["attempt"] or not saved.get("at"):
            return
        if (saved.get("step") or 0) > (attempt.get("checkpoint_step") or 0):
            attempt["checkpoint_step"] = saved["step"]
            attempt["checkpoint_at"] = saved["at"]

    def mark_failed(self, attempt: dict[str, Any], code: int, how: str) -> None:
        """A trainer killed, hung, or dead before it wrote status.json (an import error) could
        not say it ended: status.json says so for it (`exit_code`: its exit code, or minus the
        signal), so a deploy's health check fails at once and a deploy during the back-off
        sees no trainer that trains."""
        status = read_status(self.status_path)
        if status.get("attempt", 0) != attempt["attempt"]:  # none of its own: a new one
            status = {"run_id": self.run_id, "attempt": attempt["attempt"], "step": 0,
                      "release": self.release}  # fmt: skip
        elif state_is(status, "failed"):  # it said so itself, with its own error
            return
        status.update(state_fields("failed"), exit_code=code,
                      error=f"{how} (written by the supervisor)")  # fmt: skip
        write_atomic(self.status_path, status)

    def canary_failure(self, code: int) -> tuple[str, Path] | None:
        """(why, cache folder) when the attempt that just ended was ended by its compile
        cache's canary: its status.json says the canary failed, and it exited for that
        (CACHE_SUSPECT_EXIT; TORCHRUN_FAILED_EXIT under torchrun)."""
        cache = self.attempts[-1].get("compile_cache") or {}
        canary = cache.get("canary") or {}
        if canary.get("ok") is not False or code not in (CACHE_SUSPECT_EXIT, TORCHRUN_FAILED_EXIT):
            return None
        return canary["reason"], Path(cache["dir"])

    # -- restarts -------------------------------------------------------------------------
    def recent_restarts(self) -> int:
        since = time.time() - self.policy.window_s
        return sum(1 for r in self.restarts if r["started"] >= since)

    def quick_failures(self) -> int:
        """Failures in a row of attempts that ran less than the longest back-off: a trainer
        that trained longer than that starts the doubling anew (as Kubernetes resets its
        crash back-off after a while of running)."""
        count = 0
        for attempt in reversed(self.attempts):
            if attempt.get("end_reason") not in ("crash", "hung"):
                break
            if attempt["ended"] - attempt["started"] >= self.policy.backoff_max_s:
                return count + 1
            count += 1
        return count

    def finish_restart_line(self, attempt: dict[str, Any]) -> None:
        """The history line of the restart that began this attempt, once its outcome is known."""
        restart = next((r for r in self.restarts if r["attempt"] == attempt["attempt"]), None)
        if restart is None or restart.get("recorded"):
            return
        first = epoch(attempt.get("first_step_at"))
        if first is None and "ended" not in attempt:
            return
        restart["time_to_first_step_s"] = round(first - restart["ended_at"], 1) if first else None
        restart["resumed_from_step"] = attempt.get("resumed_from_step")
        self.append_history(restart, "restarted" if first else "failed")

    def append_history(self, restart: dict[str, Any], result: str) -> None:
        restart["recorded"] = True
        status = read_status(self.status_path)  # once: release and tree of the same file
        line = {
            "time": utc_text(time.time()),
            "action": "restart",
            "result": result,
            "release": status.get("release") or self.release,
            "tree_sha256": status.get("code_tree_sha256"),
            "run_id": self.run_id,
            **{k: restart.get(k) for k in RESTART_FIELDS},
        }
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        try:
            append_line(self.root / HISTORY_FILE, data)
        except OSError as exc:
            log(f"cannot write the restart to {HISTORY_FILE}: {exc}")

    def note_restart(self, code: int, reason: str) -> dict[str, Any]:
        ended = self.attempts[-1]
        why = "hung" if reason == "hung" else how_ended(code)
        # The newest checkpoint as it is on disk now: the one the next attempt resumes from.
        on_disk = newest_step(self.checkpoints) if self.checkpoints else None
        saved = max(ended.get("checkpoint_step") or 0, on_disk or 0)
        step = max(ended.get("step") or 0, saved)
        error = ended.get("error") or last_error(self.log_path, ended.get("log_at", 0))
        entry = compiled_entry(self.log_path, ended.get("log_at", 0), self.cache)
        restart = {
            "attempt": len(self.attempts),  # the attempt this restart begins
            "reason": why,
            "exit": code,
            "step": step,
            "checkpoint_step": saved,
            "steps_lost": step - saved,
            "error": error,
            "compiled_entry": entry,
            "ended_at": ended["ended"],
            "started": time.time(),
        }
        self.restarts.append(restart)
        restart["restarts_in_window"] = self.recent_restarts()
        self.last_error = f"{why}" + (f": {error}" if error else "")
        if entry:
            self.last_error += f" (in the compiled code of {entry})"
        return restart

    def pending_restart(self) -> dict[str, Any] | None:
        """The restart that begins the next attempt, before that attempt starts."""
        restart = self.restarts[-1] if self.restarts else None
        return restart if restart and restart["attempt"] == len(self.attempts) else None

    # -- the loop -------------------------------------------------------------------------
    @staticmethod
    def attempt_record(attempt: dict[str, Any]) -> dict[str, Any]:
        """An attempt as supervisor.json shows it: times as text, not epoch seconds."""
        out = {k: v for k, v in attempt.items() if k not in ("started", "ended", "log_at")}
        out["started_at"] = utc_text(attempt["started"])
        out["ended_at"] = utc_text(attempt["ended"]) if "ended" in attempt else None
        return out

    def save(self) -> None:
        now = time.time()
        latest = self.restarts[-1] if self.restarts else None
        write_atomic(
            self.state_path,
            {
                "pid": os.getpid(),
                "run_id": self.run_id,
                "state": self.state,
                "state_is": list(SUPERVISOR_STATES[self.state]),
                "updated_at": utc_text(now),
                "started_at": utc_text(self.started),
                "policy": asdict(self.policy),
                "hang_after_s": self.policy.hang_limit(read_status(self.status_path)),
                "save_limit_s": self.policy.save_limit(self.longest_save_s),
                "restarts": {
                    "count": len(self.restarts),
                    "in_window": self.recent_restarts(),
                    "last_reason": latest["reason"] if latest else None,
                    "last_at": utc_text(latest["ended_at"]) if latest else None,
                    "time_to_first_step_s": latest.get("time_to_first_step_s") if latest else None,
                },
                "last_error": self.last_error,
                # verify's trainer_down finding says when the trainer comes back.
                "backoff_until": utc_text(self.backoff_until)
                if self.state == "backoff" and self.backoff_until
                else None,
                "attempts": [self.attempt_record(a) for a in self.attempts],
                "goodput": goodput(self.attempts, self.started, now),
            },
        )
