"""python -m dflash.supervise [policy] -- COMMAND: run.sh's trainer under a restart policy.

Starts COMMAND (the trainer, or torchrun with its workers) and watches it:
- it exits with an error or is killed: it starts again after a back-off (doubling from
  --backoff up to --backoff-max with each quick failure in a row) and resumes from its newest
  complete checkpoint, unless --max-restarts restarts happened within the last --window
  seconds (a crash loop): then it stays stopped and supervisor.json says why;
- it makes no step for the hang limit while its status.json says it runs (a deadlocked
  collective, a stopped rank): every trainer process writes its Python stack to the log
  (faulthandler, SIGUSR1), then the whole process tree is killed and restarted as above;
- it exits because its compile cache failed the canary (CACHE_SUSPECT_EXIT, and status.json
  says so: a warm start whose first steps gave NaN, dflash.compile_watch): the cache folder is
  moved aside (<folder>.failed-<UTC time>, FAILED.json inside) and the trainer restarts at once,
  with no back-off, to compile anew; it counts as a restart like any other;
- before every start, the compile cache's files are checked against the hashes recorded when
  they were compiled (dflash.cache_files): a damaged file is moved aside (the restart line's
  `cache_damaged`), and a crash in compiled code names the entry it ran (`compiled_entry`);
- it exits 0 (finished, or stopped on purpose): the supervisor ends too. SIGTERM or SIGINT to the
  supervisor (stop.yml, a deploy) ends it without a restart, even during a back-off.

Each restart is one `restart` line in the state root's history.jsonl, written once the new
trainer makes its first step (or fails again); supervisor.json in the run folder holds the
attempts, the restarts, and the run's goodput (dflash.supervision.record keeps that record).
Standard
library only: it starts before torch is imported and must not be what fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dflash.cache_files import repair
from dflash.compile_watch import cache_dir
from dflash.flags import supervise_parser, supervise_problems
from dflash.stopflag import StopFlag
from dflash.supervision.files import log, move_aside, read_status
from dflash.supervision.goodput import epoch
from dflash.supervision.record import CANARY_FAILED, Policy, RunRecord
from dflash.supervision.restart_facts import checkpoint_dir, dumps_written, log_size, release_name
from dflash.supervision.states import state_is

# The stacks of a hung trainer reach the log before the kill: it is killed once the dumps are
# whole in the log (wait_for_stacks), or after DUMP_WAIT_S at most (a process that cannot run its
# signal handler in time: a loaded machine paging it back in after its stop).
DUMP_WAIT_S = 20.0
POLL_S = 0.5
SAVE_EVERY_S = 2.0
FULL_DISK_BYTES = 1 << 20  # less free than this: status.json may fail to be written
# A poll this late means the supervisor itself did not run (its container frozen or suspended
# with the trainer): the trainer's silence over that gap is no hang.
FROZEN_AFTER_S = 10 * POLL_S


def parse(argv: Sequence[str]) -> tuple[Policy, Path, str, list[str]]:
    # The policy's flags, bounds and defaults are dflash.flags' (the toolkit checks a deploy's
    # policy with them before anything changes): only where it runs and what are added here.
    parser = argparse.ArgumentParser(
        prog="python -m dflash.supervise", description=__doc__, parents=[supervise_parser()]
    )
    parser.add_argument("--root", type=Path, default=os.environ.get("DFLASH_ROOT"))
    parser.add_argument("--run-id", default=os.environ.get("DFLASH_RUN_ID"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    for problem in supervise_problems(args):
        parser.error(problem)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.root is None or not args.run_id:
        parser.error("give --root and --run-id (run.sh exports both) and -- COMMAND")
    policy = Policy(args.max_restarts, args.window, args.backoff, args.backoff_max, args.hang_after)
    return policy, args.root, args.run_id, command


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
    """A process of `python -m dflash.train`: the one trainer, or a torchrun worker. Not torchrun
    itself, whose command line names dflash.train too but which has no stack dump for SIGUSR1
    (the signal would end it, and its workers would be out of the tree's reach)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"dflash.train" in words and b"torch.distributed.run" not in words


def wait_for_stacks(log: Path, since: int, processes: int) -> None:
    """Until `log` holds, after byte `since`, the whole dump of `processes` trainer processes,
    or DUMP_WAIT_S have passed (a dump cut short: a main thread over faulthandler's 100 frames)."""
    deadline = time.monotonic() + DUMP_WAIT_S
    while dumps_written(log, since) < processes and time.monotonic() < deadline:
        time.sleep(0.1)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Supervisor:
    def __init__(self, policy: Policy, record: RunRecord, command: list[str]) -> None:
        self.policy = policy
        self.record = record
        self.command = command
        self.stop = StopFlag()  # set by a signal handler: no lock (dflash/stopflag.py)
        self.stop_reason = ""
        self.full_disk_at = 0.0  # when the run folder's disk was last seen full
        self.thawed_at = 0.0  # when the supervisor last found it had been frozen
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        # The trainer shares this process group, so a stop by the launcher reached it already;
        # the supervisor only has to not start another.
        self.stop_reason = self.stop_reason or signal.Signals(signum).name
        self.stop.set()

    def start(self) -> subprocess.Popen[bytes] | None:
        """Start the trainer; None when it cannot even be started (its interpreter removed):
        then the attempt has ended already, as a crash with exit code 127."""
        attempt = self.record.begin()
        env = {**os.environ, "DFLASH_ATTEMPT": str(attempt["attempt"])}
        try:
            proc = subprocess.Popen(self.command, env=env)
        except OSError as exc:
            attempt["error"] = f"cannot start: {exc}"
            log(f"cannot start {self.command[0]}: {exc}")
            self.record.end(127, "crash")
            return None
        attempt["pid"] = proc.pid
        return proc

    def hung(self, status: dict[str, Any]) -> str | None:
        """What the trainer failed to do in time, when it is hung: no step within the hang
        limit while one is due, or a checkpoint save past the save limit; else None. Compiles
        are not judged (they may be long)."""
        if status.get("attempt", 0) != self.record.attempts[-1]["attempt"]:
            return None
        if state_is(status, "steps_due"):
            since, limit = status.get("last_step_at"), self.policy.hang_limit(status)
        elif state_is(status, "saving"):
            since = status.get("checkpoint_started_at")
            limit = self.policy.save_limit(self.record.longest_save_s)
        else:
            return None
        self.note_full_disk()
        # A full disk stops status.json, not the trainer (dflash/supervision/status.py): the
        # steps it cannot report are no sign of a hang, so idle time counts from when it had
        # room.
        last = max(epoch(since) or 0.0, self.full_disk_at, self.thawed_at)
        idle = time.time() - last if last else 0.0
        if idle <= limit:
            return None
        step = status.get("step")
        if state_is(status, "steps_due"):
            return f"no step for {idle:.0f} s (step {step}, limit {limit:.0f} s)"
        return (
            f"the checkpoint save at step {step} has run {idle:.0f} s (limit {limit:.0f} s; "
            f"the run's longest save {self.record.longest_save_s:g} s)"
        )

    def note_full_disk(self) -> None:
        try:
            stat = os.statvfs(self.record.run_dir)
        except OSError:
            return
        if stat.f_bavail * stat.f_frsize >= FULL_DISK_BYTES:
            return
        if not self.full_disk_at:
            log(f"the disk of {self.record.run_dir} is full: status.json cannot be written, so "
                "the trainer is not judged hung until it has room again")  # fmt: skip
        self.full_disk_at = time.time()

    def note_gap(self, polled: float) -> float:
        """The time now; a gap since the last poll (`polled`) past FROZEN_AFTER_S is a freeze
        of the supervisor itself, from which the trainer's idle time counts anew."""
        now = time.time()
        gap = now - polled
        if gap > FROZEN_AFTER_S:
            log(f"the supervisor did not run for {gap:.0f} s (its container frozen or suspended?):"
                " the trainer's idle time counts from now, that gap is no hang")  # fmt: skip
            self.thawed_at = now
        return now

    def kill_hung(self, proc: subprocess.Popen[bytes], why: str) -> None:
        tree = [proc.pid, *descendants(proc.pid)]
        trainers = [pid for pid in tree if is_trainer(pid)]
        log(
            f"hung: {why}; the Python stacks of pids {trainers} follow in this log, then the "
            "trainer is killed"
        )
        self.record.state = "hung"
        self.record.attempts[-1]["hang_dump"] = str(self.record.run_dir / "train.log")
        self.record.save()
        dump_from = log_size(self.record.log_path)
        signal_all(trainers, signal.SIGUSR1)  # faulthandler's dump (pending while stopped)
        signal_all(tree, signal.SIGCONT)  # a stopped process handles it only once continued
        wait_for_stacks(self.record.log_path, dump_from, len(trainers))
        signal_all([proc.pid, *descendants(proc.pid)], signal.SIGKILL)

    def supervise_one(self, proc: subprocess.Popen[bytes]) -> tuple[int, str]:
        """Wait for this attempt to end: (exit code, `crash`|`hung`|`stopped`|`finished`)."""
        reason = None
        last_save = 0.0
        polled = time.time()
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            polled = self.note_gap(polled)
            if reason == "hung":  # what it did past the hang (once continued) does not count
                continue
            status = read_status(self.record.status_path)
            self.record.observe(status)
            if not self.stop.is_set() and (why := self.hung(status)):
                # A freeze that began after this poll's first look is no hang either.
                thawed_at, polled = self.thawed_at, self.note_gap(polled)
                if self.thawed_at == thawed_at:
                    self.kill_hung(proc, why)
                    reason = "hung"
            if time.monotonic() - last_save > SAVE_EVERY_S:
                self.record.save()
                last_save = time.monotonic()
        if reason is None:
            reason = "stopped" if self.stop.is_set() else "finished" if code == 0 else "crash"
        self.record.end(code, reason)
        return code, reason

    def set_cache_aside(self, restart: dict[str, Any], why: str, folder: Path) -> None:
        """Move the cache that failed its canary out of the restarted trainer's way; a move
        that fails (the folder gone already) is said, and the restart goes ahead."""
        restart["reason"] = f"{CANARY_FAILED}: {why}"
        restart["cache_moved_aside"] = None
        try:
            aside = move_aside(folder, restart["reason"], self.record.run_id)
        except OSError as exc:
            log(
                f"the compile cache {folder} failed its canary ({why}) but cannot be moved "
                f"aside: {exc.strerror or exc}; the trainer restarts at once all the same"
            )
            return
        restart["cache_moved_aside"] = str(aside)
        log(
            f"the compile cache {folder} failed its canary ({why}): moved aside to {aside}; the "
            "trainer restarts at once and compiles anew"
        )

    def check_cache(self) -> None:
        """Before every start: the compile cache's files that differ from the hashes recorded
        when they were compiled are moved aside (the trainer compiles them anew), and files no
        process recorded (their compiler died first) are recorded (dflash.cache_files)."""
        folder = self.record.cache
        if folder is None or not folder.is_dir():
            return
        try:
            found = repair(folder, f"the supervisor of run {self.record.run_id}")
        except OSError as exc:  # a full disk: the start goes ahead on the cache as it is
            log(f"cannot check the compile cache {folder}: {exc.strerror or exc}")
            return
        damaged = found["damaged"]
        if not damaged:
            return
        named = ", ".join(damaged[:5]) + (", ..." if len(damaged) > 5 else "")
        log(
            f"the compile cache {folder}: {len(damaged)} file(s) differ from the hashes recorded "
            f"when they were compiled ({named}): moved aside to {found['moved_aside']}; the "
            "trainer compiles them anew"
        )
        restart = self.record.pending_restart()
        if restart is not None:
            restart["cache_damaged"] = damaged
            restart["cache_moved_aside"] = found["moved_aside"]

    def run(self) -> int:
        record, policy = self.record, self.policy
        log(f"{' '.join(self.command[:3])}...: restarts {asdict(policy)}")
        code = 0
        while not self.stop.is_set():
            self.check_cache()
            proc = self.start()
            record.save()
            code, reason = (127, "crash") if proc is None else self.supervise_one(proc)
            if reason in ("stopped", "finished"):
                record.state = "stopped"
                break
            restart = record.note_restart(code, reason)
            suspect = record.canary_failure(code)
            if suspect:
                self.set_cache_aside(restart, *suspect)
            if restart["restarts_in_window"] > policy.max_restarts:
                record.state = "crash_loop"
                record.restarts.pop()
                done = restart["restarts_in_window"] - 1  # the restarts made before this end
                record.append_history({**restart, "restarts_in_window": done}, "crash_loop")
                limit = (
                    f"after {policy.max_restarts} restarts within {policy.window_s:g} s"
                    if policy.max_restarts
                    else "and restarts are off"
                )
                log(
                    f"crash loop: the trainer ended ({record.last_error}) {limit}; it stays "
                    "stopped until the next deploy"
                )
                break
            # A cold cache is the cure, not time: no back-off after a failed canary.
            wait = 0.0 if suspect else policy.backoff(record.quick_failures())
            record.state = "backoff"
            record.backoff_until = time.time() + wait
            log(
                f"the trainer ended ({record.last_error}) at step {restart['step']}, its last "
                f"checkpoint at step {restart['checkpoint_step']}; restart "
                f"{restart['restarts_in_window']} of {policy.max_restarts} within "
                f"{policy.window_s:g} s in {wait:g} s"
            )
            record.save()
            if self.stop.wait(wait):
                record.restarts.pop()  # stopped during the back-off: no restart happened
                record.state = "stopped"
                break
            restart["down_s"] = round(time.time() - restart["ended_at"], 1)
        else:
            record.state = "stopped"
        record.save()
        if self.stop.is_set():
            log(f"stopped ({self.stop_reason})")
        return 0 if record.state == "stopped" else code or 1


def main(argv: Sequence[str] | None = None) -> int:
    policy, root, run_id, command = parse(sys.argv[1:] if argv is None else argv)
    record = RunRecord(
        policy, root, run_id, checkpoints=checkpoint_dir(command), release=release_name(),
        cache=cache_dir(),
    )  # fmt: skip
    return Supervisor(policy, record, command).run()
