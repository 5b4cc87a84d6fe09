"""python -m dflash.supervise [policy] -- COMMAND: run.sh's trainer under a restart policy.

Starts COMMAND (the trainer, or torchrun with its workers) and watches it:
- it exits with an error or is killed: it starts again after a back-off (doubling from
  --backoff up to --backoff-max) and resumes from its newest complete checkpoint, unless
  --max-restarts restarts happened within the last --window seconds (a crash loop): then it
  stays stopped and supervisor.json says why;
- it makes no step for the hang limit while its status.json says it runs (a deadlocked
  collective, a stopped rank): every trainer process writes its Python stack to the log
  (faulthandler, SIGUSR1), then the whole process tree is killed and restarted as above;
- it exits 0 (finished, or stopped on purpose): the supervisor ends too. SIGTERM or SIGINT to the
  supervisor (stop.yml, a deploy) ends it without a restart, even during a back-off.

Each restart is one `restart` line in the state root's history.jsonl, written once the new
trainer makes its first step (or fails again); supervisor.json in the run folder holds the
attempts, the restarts, and the run's goodput (dflash.goodput). Standard library only: it
starts before torch is imported and must not be what fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dflash.goodput import epoch, goodput

SUPERVISOR_FILE = "supervisor.json"
HISTORY_FILE = "history.jsonl"
HANG_FLOOR_S = 300.0  # the automatic hang limit is never shorter (a slow step, a recompile)
HANG_STEPS = 10  # ... nor shorter than this many median steps
DUMP_WAIT_S = 3.0  # time the stacks get to reach the log before the kill
POLL_S = 0.5


def utc_text(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


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

    def backoff(self, recent: int) -> float:
        """The wait before restart number `recent` of the window (1 is the first)."""
        return min(self.backoff_s * 2 ** max(0, recent - 1), self.backoff_max_s)


def hang_after(text: str) -> float | None:
    if text == "auto":
        return None
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--hang-after {text}: give seconds > 0, or auto")
    return value


def parse(argv: Sequence[str]) -> tuple[Policy, Path, str, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m dflash.supervise", description=__doc__)
    parser.add_argument("--max-restarts", type=int, default=5)
    parser.add_argument("--window", type=float, default=3600.0, help="seconds")
    parser.add_argument("--backoff", type=float, default=10.0, help="seconds")
    parser.add_argument("--backoff-max", type=float, default=300.0, help="seconds")
    parser.add_argument("--hang-after", type=hang_after, default=None, help="seconds, or auto")
    parser.add_argument("--root", type=Path, default=os.environ.get("DFLASH_ROOT"))
    parser.add_argument("--run-id", default=os.environ.get("DFLASH_RUN_ID"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.root is None or not args.run_id:
        parser.error("give --root and --run-id (run.sh exports both) and -- COMMAND")
    policy = Policy(args.max_restarts, args.window, args.backoff, args.backoff_max, args.hang_after)
    return policy, args.root, args.run_id, command


def log(message: str) -> None:
    print(f"{utc_text(time.time())} supervisor: {message}", flush=True)


def read_status(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(temp, path)
    except OSError as exc:  # a full disk must not end the supervision of a running trainer
        log(f"cannot write {path}: {exc}")


def descendants(pid: int) -> list[int]:
    """`pid`'s children, grandchildren...: torchrun's workers are in sessions of their own, so a
    process group does not reach them; the parent links do."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            parents[int(name)] = int(stat.rsplit(b")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def is_trainer(pid: int) -> bool:
    try:
        return b"dflash.train" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def how_ended(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class Supervisor:
    def __init__(self, policy: Policy, root: Path, run_id: str, command: list[str]) -> None:
        self.policy = policy
        self.root = root
        self.run_id = run_id
        self.command = command
        self.run_dir = root / "runs" / run_id
        self.status_path = self.run_dir / "status.json"
        self.state_path = self.run_dir / SUPERVISOR_FILE
        self.started = time.time()
        self.attempts: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []
        self.state = "starting"
        self.last_error: str | None = None
        self.stop = threading.Event()
        self.stop_reason = ""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        # The trainer shares this process group, so a stop by the launcher reached it already;
        # the supervisor only has to not start another.
        self.stop_reason = self.stop_reason or signal.Signals(signum).name
        self.stop.set()

    # -- one start of the trainer ---------------------------------------------------------
    def start(self) -> subprocess.Popen[bytes] | None:
        """Start the trainer; None when it cannot even be started (its interpreter removed):
        then the attempt has ended already, as a crash with exit code 127."""
        attempt = len(self.attempts)
        env = {**os.environ, "DFLASH_ATTEMPT": str(attempt)}
        self.attempts.append({"attempt": attempt, "started": time.time()})
        self.state = "running"
        try:
            proc = subprocess.Popen(self.command, env=env)
        except OSError as exc:
            self.attempts[-1].update(
                ended=time.time(), exit=127, end_reason="crash", error=f"cannot start: {exc}"
            )
            log(f"cannot start {self.command[0]}: {exc}")
            return None
        self.attempts[-1]["pid"] = proc.pid
        return proc

    def observe(self, status: dict[str, Any]) -> None:
        """Copy what status.json says of the current attempt (only its own: a status.json left by
        the attempt before has another `attempt`)."""
        attempt = self.attempts[-1]
        if status.get("attempt", 0) != attempt["attempt"]:
            return
        for key in ("first_step_at", "last_step_at", "step", "checkpoint_seconds", "error"):
            attempt[key] = status.get(key)
        attempt["resumed_from_step"] = status.get("resumed_from_step") or 0
        saved = status.get("checkpoint") or {}
        attempt["checkpoint_step"] = saved.get("step") or 0
        attempt["checkpoint_at"] = saved.get("at")  # only a checkpoint this attempt saved
        self._finish_restart_line(attempt)

    def hung(self, status: dict[str, Any]) -> float | None:
        """Seconds since the last step when that is past the hang limit, else None."""
        if status.get("attempt", 0) != self.attempts[-1]["attempt"]:
            return None
        if status.get("state") != "running":  # warming (compiling) and checkpoints may be long
            return None
        last = epoch(status.get("last_step_at"))
        idle = time.time() - last if last else 0.0
        return idle if idle > self.policy.hang_limit(status) else None

    def kill_hung(self, proc: subprocess.Popen[bytes], idle: float, status: dict[str, Any]) -> None:
        tree = [proc.pid, *descendants(proc.pid)]
        trainers = [pid for pid in tree if is_trainer(pid)]
        log(
            f"hung: no step for {idle:.0f} s (step {status.get('step')}, limit "
            f"{self.policy.hang_limit(status):.0f} s); the Python stacks of pids {trainers} follow "
            "in this log, then the trainer is killed"
        )
        self.state = "hung"
        self.attempts[-1]["hang_dump"] = str(self.run_dir / "train.log")
        self.save()
        signal_all(trainers, signal.SIGUSR1)  # faulthandler's dump (pending while stopped)
        signal_all(tree, signal.SIGCONT)  # a stopped process handles it only once continued
        time.sleep(DUMP_WAIT_S)
        signal_all([proc.pid, *descendants(proc.pid)], signal.SIGKILL)

    def supervise_one(self, proc: subprocess.Popen[bytes]) -> tuple[int, str]:
        """Wait for this attempt to end: (exit code, `crash`|`hung`|`stopped`|`finished`)."""
        reason = None
        last_save = 0.0
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if reason == "hung":  # what it did past the hang (once continued) does not count
                continue
            status = read_status(self.status_path)
            self.observe(status)
            if not self.stop.is_set() and (idle := self.hung(status)):
                self.kill_hung(proc, idle, status)
                reason = "hung"
            if time.monotonic() - last_save > 2:
                self.save()
                last_save = time.monotonic()
        attempt = self.attempts[-1]
        attempt["ended"] = time.time()
        attempt["exit"] = code
        if reason is None:
            reason = "stopped" if self.stop.is_set() else "finished" if code == 0 else "crash"
        attempt["end_reason"] = reason
        if reason != "hung":
            self.observe(read_status(self.status_path))
        if reason in ("crash", "hung"):
            self.mark_failed(attempt, "hung" if reason == "hung" else how_ended(code))
        return code, reason

    def mark_failed(self, attempt: dict[str, Any], how: str) -> None:
        """A killed or hung trainer could not say it ended: status.json says so for it, so a
        deploy during the back-off sees no trainer that trains (and starts one at once)."""
        status = read_status(self.status_path)
        if status.get("attempt", 0) != attempt["attempt"] or status.get("state") == "failed":
            return
        status.update(state="failed", error=f"{how} (status.json written by the supervisor)")
        write_atomic(self.status_path, status)

    # -- restarts -------------------------------------------------------------------------
    def recent_restarts(self) -> int:
        since = time.time() - self.policy.window_s
        return sum(1 for r in self.restarts if r["started"] >= since)

    def _finish_restart_line(self, attempt: dict[str, Any]) -> None:
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
        line = {
            "time": utc_text(time.time()),
            "action": "restart",
            "result": result,
            "release": self.status_field("release"),
            "tree_sha256": self.status_field("code_tree_sha256"),
            "run_id": self.run_id,
            **{k: restart.get(k) for k in (
                "reason", "exit", "step", "checkpoint_step", "steps_lost", "down_s",
                "time_to_first_step_s", "resumed_from_step", "restarts_in_window", "error",
            )},
        }  # fmt: skip
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        try:  # one write to an O_APPEND file: whole, beside a deploy's own lines
            fd = os.open(self.root / HISTORY_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            log(f"cannot write the restart to {HISTORY_FILE}: {exc}")

    def status_field(self, key: str) -> Any:
        return read_status(self.status_path).get(key)

    def note_restart(self, code: int, reason: str) -> dict[str, Any]:
        ended = self.attempts[-1]
        why = "hung" if reason == "hung" else how_ended(code)
        restart = {
            "attempt": len(self.attempts),  # the attempt this restart begins
            "reason": why,
            "exit": code,
            "step": ended.get("step") or 0,
            "checkpoint_step": ended.get("checkpoint_step") or 0,
            "steps_lost": max(0, (ended.get("step") or 0) - (ended.get("checkpoint_step") or 0)),
            "error": ended.get("error"),
            "ended_at": ended["ended"],
            "started": time.time(),
        }
        self.restarts.append(restart)
        restart["restarts_in_window"] = self.recent_restarts()
        self.last_error = f"{why}" + (f": {ended['error']}" if ended.get("error") else "")
        return restart

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> int:
        log(f"{' '.join(self.command[:3])}...: restarts {asdict(self.policy)}")
        code = 0
        while not self.stop.is_set():
            proc = self.start()
            self.save()
            if proc is None:
                self._finish_restart_line(self.attempts[-1])
                code, reason = 127, "crash"
            else:
                code, reason = self.supervise_one(proc)
            if reason in ("stopped", "finished"):
                self.state = "stopped"
                break
            restart = self.note_restart(code, reason)
            if restart["restarts_in_window"] > self.policy.max_restarts:
                self.state = "crash_loop"
                self.restarts.pop()
                done = restart["restarts_in_window"] - 1  # the restarts made before this end
                self.append_history({**restart, "restarts_in_window": done}, "crash_loop")
                log(
                    f"crash loop: the trainer ended ({self.last_error}) after "
                    f"{self.policy.max_restarts} restarts within {self.policy.window_s:g} s; "
                    "it stays stopped until the next deploy"
                )
                break
            wait = self.policy.backoff(restart["restarts_in_window"])
            self.state = "backoff"
            log(
                f"the trainer ended ({self.last_error}) at step {restart['step']}, its last "
                f"checkpoint at step {restart['checkpoint_step']}; restart "
                f"{restart['restarts_in_window']} of {self.policy.max_restarts} within "
                f"{self.policy.window_s:g} s in {wait:g} s"
            )
            self.save()
            if self.stop.wait(wait):
                self.restarts.pop()  # stopped during the back-off: no restart happened
                self.state = "stopped"
                break
            restart["down_s"] = round(time.time() - restart["ended_at"], 1)
        else:
            self.state = "stopped"
        self.save()
        if self.stop.is_set():
            log(f"stopped ({self.stop_reason})")
        return 0 if self.state == "stopped" else code or 1

    @staticmethod
    def attempt_record(attempt: dict[str, Any]) -> dict[str, Any]:
        """An attempt as supervisor.json shows it: times as text, not epoch seconds."""
        out = {k: v for k, v in attempt.items() if k not in ("started", "ended")}
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
                "updated_at": utc_text(now),
                "started_at": utc_text(self.started),
                "policy": asdict(self.policy),
                "hang_after_s": self.policy.hang_limit(read_status(self.status_path)),
                "restarts": {
                    "count": len(self.restarts),
                    "in_window": self.recent_restarts(),
                    "last_reason": latest["reason"] if latest else None,
                    "last_at": utc_text(latest["ended_at"]) if latest else None,
                    "time_to_first_step_s": latest.get("time_to_first_step_s") if latest else None,
                },
                "last_error": self.last_error,
                "attempts": [self.attempt_record(a) for a in self.attempts],
                "goodput": goodput(self.attempts, self.started, now),
            },
        )


def main(argv: Sequence[str] | None = None) -> int:
    policy, root, run_id, command = parse(sys.argv[1:] if argv is None else argv)
    return Supervisor(policy, root, run_id, command).run()


if __name__ == "__main__":
    sys.exit(main())
