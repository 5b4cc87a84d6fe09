"""A week in an hour: the whole toolkit on the local target for --duration under a seeded
schedule of real faults, with verify.yml every --verify-every as a cron job would run it (beside
whatever else runs); a ledger of what was injected and what the toolkit said, checked afterwards
(bench/soak_ledger.py).

    .venv/bin/python bench/soak.py --duration 1h --every 2m --seed 7 [--faults kill_trainer,hang]

The trainer (CPU, tiny model) comes from a git copy of this checkout's dflash/, tagged v1 (a new
release is a real commit there), and trains on a store the soak prepared. The faults (FAULTS,
docs/soak.md): kill -9 and SIGSTOP of the trainer, kill -9 of the supervisor, a redeploy, a new
release, rollback.yml, a deploy killed midway then rerun, history.jsonl's last line torn,
trainer.json removed, the store prepared again under the trainer, the disk filled to half the
reserve (the state root on a tmpfs: as root only), and two that overlap: a rollback while the
supervisor backs off from a kill, a kill of the new trainer inside a deploy's health wait. A
fault the toolkit repairs itself must be named by a restart line and step again within its
bound; one that needs a person must be named by a verify, and its hint, run as printed, must
put it back. One fault at a time: the next waits until the last is recovered. The ledger goes
to --ledger (JSON); the summary table and every problem are printed; exit 1 when there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty, Queue
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from leftovers import stopped_at_exit  # noqa: E402
from soak_ledger import check, parse_span, schedule, summary  # noqa: E402
from soak_target import Target  # noqa: E402

from dflash.data.prepare import prepare  # noqa: E402
from dflash.data.records import Settings  # noqa: E402
from dflash.supervision.states import state_is  # noqa: E402
from tests.helpers import (  # noqa: E402
    dflash_package_files,
    git_source,
    playbook_command,
    playbook_env,
    run_playbook,
)
from tests.integration.conftest import (  # noqa: E402
    add_release,
    read_json,
    tear_last_line,
    write_records,
)

FAULTS = ("kill_trainer", "hang", "kill_supervisor", "redeploy", "new_release", "rollback",
          "kill_deploy", "torn_history", "trainer_json_removed", "data_prepared_again",
          "disk_full", "rollback_in_backoff", "kill_in_health_wait",
          "hang_in_checkpoint")  # fmt: skip
# The trainer's own faults, which its supervisor restarts: the restart line's reason.
RESTARTED = {"kill_trainer": "signal SIGKILL", "hang": "hung", "hang_in_checkpoint": "hung"}
# What a verify may name while a fault of this kind is open (not yet recovered).
EXPECTS = {
    "kill_trainer": ["trainer_down", "heartbeat_stale"],
    "hang": ["hung", "heartbeat_stale", "trainer_down"],
    # Frozen inside a save: no step is due, so not `hung`; its heartbeat stops.
    "hang_in_checkpoint": ["heartbeat_stale", "trainer_down"],
    "kill_supervisor": ["supervisor_gone"],
    "torn_history": ["history"],
    "trainer_json_removed": ["trainer_record"],
    "data_prepared_again": ["data"],
    "rollback_in_backoff": ["trainer_down", "heartbeat_stale"],  # the kill before the rollback
    "disk_full": ["disk"],
    # A deploy killed midway leaves its lock behind until the rerun takes it over.
    "kill_deploy": ["release"],
}
# The faults a person repairs, from what verify names (the rest the toolkit repairs itself, or
# are a deploy or rollback whose own exit says how it went).
BY_A_PERSON = ("kill_supervisor", "torn_history", "trainer_json_removed", "data_prepared_again",
               "disk_full")  # fmt: skip
# The state root's own file system for disk_full (a tmpfs: filling it harms nothing else), and
# the reserve the toolkit keeps there; the fault leaves half the reserve free.
TMPFS_SIZE = "6g"
RESERVE_MB = 256
MB = 1 << 20
# A save of the tiny drafter takes milliseconds: half a second more lets the soak catch one.
TRAINER = {"target_model": "tiny", "checkpoint_every": 20, "sleep_in_checkpoint": 0.5,
           "sleep_per_step": 0.2, "status_interval": 1}  # fmt: skip
# Steps the trainer may make between the soak's last look at status.json and the kill.
STEP_SLACK = int(TRAINER["status_interval"] / TRAINER["sleep_per_step"]) + 2


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.root = tmp / "root"
        self.root.mkdir()
        self.on_tmpfs = "disk_full" in args.faults
        if self.on_tmpfs:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "dflash-soak",
                            str(self.root)], check=True)  # fmt: skip
        if (REPO / "sandbox" / "envs").is_dir():  # the demo's env: no env build
            copy = "-a" if self.on_tmpfs else "-al"  # no hard link crosses file systems
            subprocess.run(["cp", copy, str(REPO / "sandbox" / "envs"), str(self.root / "envs")],
                           check=True)  # fmt: skip
        self.target = Target(self.root)
        self.filler = self.root / "filler"
        self.source = tmp / "source"
        git_source(self.source)("v1", dflash_package_files())
        self.releases = 1
        self.ref = "v1"
        self.store = tmp / "store"
        self.prepared = 0
        self.prepare_store()
        self.verify_json = tmp / "verify.json"
        policy = {"backoff": args.backoff, "backoff_max": max(args.backoff, 60),
                  "max_restarts": 1000, "window": 3600}  # fmt: skip
        # tokens/s on a shared machine is noise: neither the gate nor verify judges it here.
        self.common = {
            "dflash_root": str(self.root), "dflash_source_dir": str(self.source),
            "dflash_verify_json": str(self.verify_json), "dflash_launch": True,
            "dflash_trainer_args": TRAINER, "dflash_restart_policy": policy,
            "dflash_data": str(self.store), "dflash_disk_reserve_mb": RESERVE_MB,
            "dflash_hang_after": args.hang_after, "dflash_health_timeout": 300,
            "dflash_verify_min_throughput_ratio": 0, "dflash_verify_max_cpu_wait": 1,
            "dflash_min_throughput_ratio": 0, "dflash_stop_timeout": 30,
        }  # fmt: skip
        self.draw = random.Random(args.seed + 1)  # the moments inside a fault (a deploy's kill)
        self.started = time.monotonic()
        self.faults: list[dict[str, Any]] = []
        self.audits: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []  # the soak's own playbook runs, from and to
        self.lock = threading.Lock()  # the ledger's lists: the cron thread writes them too
        self.inbox: Queue = Queue()  # the audits the main loop has not acted on yet
        self.next_audit = 0.0
        self.injected_at = 0.0

    def say(self, text: str) -> None:
        print(f"[{self.now():7.0f} s] {text}", flush=True)

    def ledger(self) -> dict[str, Any]:
        """The ledger so far (written after every event: a soak cut short keeps it)."""
        runs = sorted((self.root / "runs").glob("*/supervisor.json"))
        with self.lock:
            return {
                "seed": self.args.seed, "duration_s": self.args.duration_s,
                "every_s": self.args.every_s, "faults": list(self.faults),
                "audits": list(self.audits), "runs": list(self.runs),
                "history": self.target.history(),
                "goodput": {path.parent.name: (read_json(path) or {}).get("goodput", {})
                            for path in runs},
            }  # fmt: skip

    def save(self) -> None:
        ledger = json.dumps(self.ledger(), indent=1) + "\n"
        with self.lock:
            self.args.ledger.parent.mkdir(parents=True, exist_ok=True)
            temp = self.args.ledger.with_suffix(".tmp")
            temp.write_text(ledger)
            temp.replace(self.args.ledger)

    # --- what the target shows ---
    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    # --- what the soak runs ---
    @contextmanager
    def busy(self, name: str) -> Iterator[None]:
        """A run of the soak's own, so an audit beside it knows a run was in progress."""
        entry = {"name": name, "from": self.now(), "to": None}
        with self.lock:
            self.runs.append(entry)
        try:
            yield
        finally:
            entry["to"] = self.now()

    def playbook(self, name: str, **extra: Any):
        with self.busy(name):
            return run_playbook(name, {**self.common, **extra}, timeout=1800)

    def deploy(self, ref: str, **extra: Any):
        run = self.playbook("deploy.yml", dflash_ref=ref, **extra)
        if run.rc == 0:
            self.ref = ref
        return run

    def new_commit(self) -> str:
        self.releases += 1
        tag = f"v{self.releases}"
        add_release(self.source, tag, "dflash/__init__.py", f"# soak release {tag}\n")
        return tag

    def prepare_store(self) -> None:
        """The training data: a store prepared (again, in place) from new samples the tiny
        target takes, as a user preparing the next data set where the run reads it would."""
        self.prepared += 1
        samples = self.store.parent / f"samples-{self.prepared}.jsonl"
        write_records(samples, seed=self.args.seed * 1000 + self.prepared, length=40)
        settings = Settings(max_seq_len=3072, vocab_size=128, tokenizer=None)
        prepare([samples], self.store, settings, force=self.prepared > 1, say=lambda _: None)

    def fault(self, kind: str, bound: float, **figures: Any) -> dict[str, Any]:
        fault = {"kind": kind, "at": self.now(), "bound_s": bound, "expects": EXPECTS.get(kind, []),
                 "detected": None, "recovered": None, **figures}  # fmt: skip
        fault["at"] = figures.get("at", fault["at"])
        with self.lock:
            self.faults.append(fault)
        return fault

    def mark(self, fault: dict[str, Any], phase: str, **how: str) -> None:
        fault[phase] = {"at": self.now(), **how}
        self.say(f"{fault['kind']} (at {fault['at']:.0f} s) {phase}: {next(iter(how.values()))}")
        self.save()

    def give_up(self, fault: dict[str, Any], why: str) -> None:
        """Not recovered as it should be: said, and put back as a person would (the current
        release started again as recorded), so the soak goes on from a healthy run."""
        fault["why"] = why
        self.say(f"{fault['kind']} (at {fault['at']:.0f} s) NOT recovered: {why[:300]}")
        self.filler.unlink(missing_ok=True)
        current = (self.root / "current").resolve().name
        run = self.playbook("rollback.yml", dflash_release=current, dflash_restart=True)
        fault["put_back"] = {"at": self.now(), "rc": run.rc, "release": current}
        self.say(f"put back by rollback.yml -e dflash_release={current}: rc {run.rc}")
        self.save()

    def action(self, kind: str, start: Callable[[], Any], release: str | None) -> None:
        """A deploy or rollback (the fault open while it runs): done when it exits 0 and the
        expected release steps."""
        fault = self.fault(kind, 600, at=self.injected_at)
        run = start()
        fault["rc"] = run.rc
        if run.rc != 0:
            self.give_up(fault, f"exited {run.rc}: {run.output[-1500:]}")
            return
        self.ref = release or self.ref
        if not fault["detected"]:
            self.mark(fault, "detected", by="rc 0")
        self.wait(lambda: self.target.stepping(release=release), 300)
        if self.target.stepping(release=release):
            self.mark(fault, "recovered", how=f"{self.target.status().get('release')} steps")
        else:
            self.give_up(
                fault, f"no trainer of {release or 'any release'} steps: {self.target.status()}"
            )

    def wait(self, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check() and time.monotonic() < deadline:
            time.sleep(0.5)

    def background_deploy(self, tag: str, log: Path) -> subprocess.Popen:
        extravars = {**self.common, "dflash_ref": tag}
        with log.open("w") as out:
            return subprocess.Popen(
                playbook_command("deploy.yml", extravars), cwd=REPO, env=playbook_env(),
                start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def killed_deploy_then_rerun(self, tag: str) -> Any:
        """A deploy killed (its process group, kill -9) at a seeded moment, then the plain
        rerun."""
        moment = round(self.draw.uniform(1, 40), 1)
        with self.busy("deploy.yml (killed)"):
            play = self.background_deploy(tag, self.root.parent / "killed-deploy.log")
            time.sleep(moment)
            os.killpg(play.pid, signal.SIGKILL)
            play.wait()
        self.faults[-1]["killed_after_s"] = moment
        return self.deploy(tag)

    def deploy_killing_its_trainer(self, tag: str) -> Any:
        """A deploy whose new trainer is killed (kill -9) once it runs, inside the deploy's
        health wait."""
        log = self.root.parent / "health-wait-deploy.log"
        with self.busy("deploy.yml (trainer killed in its health wait)"):
            play = self.background_deploy(tag, log)
            while play.poll() is None:
                status = self.target.status()
                new = status.get("release") == tag and state_is(status, "steps_due")
                if new and "killed_at" not in self.faults[-1] and status.get("pid"):
                    os.kill(status["pid"], signal.SIGKILL)
                    self.faults[-1].update(killed_at=self.now(), killed_at_step=status.get("step"))
                time.sleep(0.2)
        return SimpleNamespace(rc=play.returncode, output=log.read_text(errors="replace"))

    def deploy_through_a_health_wait_kill(self, tag: str) -> Any:
        """A trainer that ends inside its deploy's health wait fails the deploy at once, even
        while its supervisor would restart it (docs/deploy.md): the deploy must name the kill and
        put the release before back, stepping; the plain rerun a person then makes deploys
        `tag`. (A kill that came after the health check is a restart like any other.)"""
        before, fault = self.ref, self.faults[-1]
        run = self.deploy_killing_its_trainer(tag)
        fault["first_rc"] = run.rc
        if run.rc == 0:
            return run
        self.wait(lambda: self.target.stepping(release=before), 120)
        if "killed by signal 9" not in run.output or not self.target.stepping(release=before):
            return SimpleNamespace(rc=run.rc, output=f"{before} not back: {run.output}")
        self.mark(fault, "detected", by=f"the deploy named the kill; {before} steps again")
        return self.deploy(tag)

    def fill_disk(self) -> None:
        """The root's file system filled to half the reserve, as other files on it would."""
        size = shutil.disk_usage(self.root).free - RESERVE_MB * MB // 2
        with self.filler.open("wb") as out:
            os.posix_fallocate(out.fileno(), 0, size)

    def inject(self, kind: str) -> None:
        self.injected_at = self.now()
        if kind in (*RESTARTED, "rollback_in_backoff"):
            self.wait(self.target.stepping, 10)  # a checkpoint save of its own ends first
        status = self.target.status()
        args = self.args
        audit_bound = args.verify_every_s + 600  # the next audit, then its hint
        if kind in (*RESTARTED, "rollback_in_backoff") and not self.target.stepping():
            self.say(f"{kind} skipped: no trainer steps ({status.get('state')})")
        elif kind == "hang_in_checkpoint" and not (status := self.target.saving(60)):
            self.say(f"{kind} skipped: no checkpoint save began within 60 s")
        elif kind in RESTARTED:
            bound = args.backoff_max_s + 180 + (args.hang_after if kind != "kill_trainer" else 0)
            self.fault(
                kind, bound, pid=status.get("pid"), attempt=status.get("attempt", 0),
                step_at_kill=status.get("step", 0), history_at=len(self.target.history()),
                checkpoint_at_kill=(status.get("checkpoint") or {}).get("step", 0),
                step_slack=STEP_SLACK,
            )  # fmt: skip
            self.faults[-1]["killed_wall"] = time.time()
            os.kill(status["pid"], signal.SIGKILL if kind == "kill_trainer" else signal.SIGSTOP)
        elif kind == "kill_supervisor":
            supervisor = read_json(self.root / "runs" / "latest" / "supervisor.json")["pid"]
            self.fault(kind, audit_bound, pid=supervisor)
            os.kill(supervisor, signal.SIGKILL)
        elif kind == "torn_history":
            self.fault(kind, audit_bound)
            tear_last_line(self.root / "history.jsonl")
        elif kind == "trainer_json_removed":
            self.fault(kind, audit_bound)
            (self.root / "trainer.json").unlink()
        elif kind == "data_prepared_again":
            self.fault(kind, audit_bound)
            self.prepare_store()
        elif kind == "disk_full":
            self.fault(kind, audit_bound)
            self.fill_disk()
        elif kind == "redeploy":
            self.action(kind, lambda: self.deploy(self.ref), self.ref)
        elif kind == "new_release":
            tag = self.new_commit()
            self.action(kind, lambda: self.deploy(tag), tag)
        elif kind.startswith("rollback") and not (before := self.target.previous_release()):
            self.say(f"{kind} skipped: history names no deployment before the current one")
        elif kind == "rollback":
            self.action(kind, lambda: self.playbook("rollback.yml"), before)
        elif kind == "rollback_in_backoff":
            # The trainer killed, then at once a rollback: it meets a supervisor backing off.
            os.kill(status["pid"], signal.SIGKILL)
            self.action(kind, lambda: self.playbook("rollback.yml"), before)
        elif kind == "kill_deploy":
            tag = self.new_commit()
            self.action(kind, lambda: self.killed_deploy_then_rerun(tag), tag)
        elif kind == "kill_in_health_wait":
            tag = self.new_commit()
            self.action(kind, lambda: self.deploy_through_a_health_wait_kill(tag), tag)

    # --- what the toolkit said ---
    def observe(self) -> None:
        """Restart lines name crashes and hangs; a stepping trainer of a later attempt is their
        recovery. Then whatever the audits since the last look named."""
        for fault in self.open_faults():
            if fault["kind"] not in RESTARTED:
                continue
            reason = RESTARTED[fault["kind"]]
            lines = [
                x for x in self.target.restart_lines(fault["history_at"]) if x["reason"] == reason
            ]
            if lines and not fault["detected"]:
                fault["restart_line"] = lines[0]
                self.mark(fault, "detected", by=f"restart line: {reason}")
            if fault["detected"] and self.target.stepping(attempt_over=fault["attempt"]):
                # The ledger's own time down: from the kill to the first step logged after it.
                fault["first_step_wall"] = self.target.first_step_after(fault["killed_wall"])
                self.mark(fault, "recovered", how="the supervisor restarted it")
        self.read_audits()

    def open_faults(self) -> list[dict[str, Any]]:
        with self.lock:
            return [f for f in self.faults if not f["recovered"] and "why" not in f]

    def cron(self, done: threading.Event) -> None:
        """verify.yml every --verify-every whatever else runs, as a cron job would."""
        while not done.wait(0.5):
            if self.now() >= self.next_audit:
                self.next_audit = self.now() + self.args.verify_every_s
                self.audit()

    def audit(self) -> dict[str, Any]:
        """One verify.yml; the ledger keeps what it said, the faults open at any moment of it
        and the soak's runs beside it; the main loop acts on it (read_audits)."""
        began = self.now()
        open_then = {id(f): f for f in self.open_faults()}
        report = self.verify_json.with_name(f"verify-{began:.0f}.json")
        verify = run_playbook("verify.yml", {**self.common, "dflash_verify_json": str(report)},
                              timeout=1800)  # fmt: skip
        host = (read_json(report) or {}).get("hosts", {}).get("local", {})
        report.unlink(missing_ok=True)
        findings = host.get("findings", [])
        ended = self.now()
        open_then.update({id(f): f for f in self.open_faults()})
        with self.lock:
            beside = sorted({run["name"] for run in self.runs
                             if run["from"] < ended and (run["to"] or ended) > began})  # fmt: skip
            audit = {
                "from": began, "at": ended, "rc": verify.rc, "verdict": host.get("verdict"),
                "findings": [f["kind"] for f in findings],
                "found": [f"{f['kind']}: {f.get('found')}"[:300] for f in findings],
                "in_progress": [f["kind"] for f in findings if f.get("state") == "in_progress"],
                "open_faults": [{"kind": f["kind"], "expects": f["expects"]}
                                for f in open_then.values()],
                "beside": beside,
            }  # fmt: skip
            self.audits.append(audit)
        self.say(f"verify: {host.get('verdict')} {audit['findings'] or ''}"
                 + (f" beside {', '.join(beside)}" if beside else ""))  # fmt: skip
        self.save()
        self.inbox.put((audit, findings))
        return audit

    def read_audits(self) -> None:
        """A fault an audit begun after it names is detected; the finding's hint, run as
        printed, repairs it (a full disk is freed by hand, as a person would)."""
        while True:
            try:
                audit, findings = self.inbox.get_nowait()
            except Empty:
                return
            for fault in self.open_faults():
                named = [f for f in findings if f["kind"] in fault["expects"]]
                if not named or fault["at"] > audit["from"] or fault["kind"] not in BY_A_PERSON:
                    continue
                if not fault["detected"]:
                    self.mark(fault, "detected", by=f"verify: {named[0]['kind']}")
                if fault["kind"] == "disk_full":
                    self.filler.unlink()
                    self.mark(fault, "recovered", how="the filler removed by hand")
                else:
                    self.run_hint(fault, named[0])

    def run_hint(self, fault: dict[str, Any], finding: dict[str, Any]) -> None:
        """The finding's hint, run as printed (with the soak's own settings beside it)."""
        hint = finding.get("hint", "")
        if "ansible-playbook " not in hint:
            self.give_up(fault, f"the hint names no command: {hint!r}")
            return
        # The command inside the sentence: the playbook, then `-e key=value` pairs.
        name, *words = hint.split("ansible-playbook ", 1)[1].split()
        name, extra = name.rstrip("),.;"), {}
        while len(words) >= 2 and words[0] == "-e" and "=" in words[1]:
            key, value = words[1].rstrip("),.;").split("=", 1)
            extra[key] = {"true": True, "false": False}.get(value, value)
            words = words[2:]
        run = self.playbook(name, **extra)
        fault["hint"] = hint
        if run.rc == 0:
            self.wait(lambda: self.target.stepping(), 300)
        if run.rc == 0 and self.target.stepping():
            self.mark(fault, "recovered", how=f"the hint: {name} {extra}")
        else:
            self.give_up(fault, f"the hint {hint!r} exited {run.rc}: {run.output[-1500:]}")

    def settle(self, limit: float) -> None:
        """Observe until no fault is open or `limit` seconds pass."""
        deadline = time.monotonic() + limit
        while self.open_faults() and time.monotonic() < deadline:
            self.observe()
            time.sleep(1)

    # --- the run ---
    def run(self) -> dict[str, Any]:
        args = self.args
        first = self.deploy("v1")
        if first.rc != 0:
            sys.exit(first.output[-4000:])
        self.started = time.monotonic()  # the schedule counts from the first healthy trainer
        plan = schedule(args.seed, args.duration_s, args.every_s, args.faults)
        self.next_audit = args.verify_every_s
        done = threading.Event()
        cron = threading.Thread(target=self.cron, args=(done,), daemon=True)
        cron.start()
        settled = args.backoff_max_s + args.hang_after + args.verify_every_s + 600
        try:
            for at, kind in plan:
                while self.now() < at:
                    self.observe()
                    time.sleep(1)
                # One fault at a time: the next waits until the last is recovered (or given up).
                self.settle(settled)
                self.say(kind)
                self.inject(kind)
                self.save()
            self.settle(settled)
            self.wait(lambda: self.target.stepping(), 300)
        finally:
            done.set()
            cron.join()
        self.read_audits()
        last = self.audit()
        end = {"verdict": last["verdict"], "findings": last["findings"],
               "stepping": self.target.stepping(),
               "release": self.target.status().get("release")}  # fmt: skip
        return {**self.ledger(), "end": end}

    def unmount(self) -> None:
        if self.on_tmpfs:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="10m", help="300, 20m, 1h, 3d")
    parser.add_argument("--every", default="60s", help="the time between two faults")
    parser.add_argument("--verify-every", default="60s", help="the time between two audits")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS), help="a comma-separated subset")
    parser.add_argument("--backoff", type=int, default=5, help="dflash_restart_policy.backoff")
    parser.add_argument("--hang-after", type=int, default=30, help="dflash_hang_after")
    parser.add_argument("--ledger", type=Path, default=REPO / "reports" / "soak-ledger.json")
    args = parser.parse_args()
    try:
        args.duration_s = parse_span(args.duration)
        args.every_s = parse_span(args.every)
        args.verify_every_s = parse_span(args.verify_every)
    except ValueError as exc:
        parser.error(str(exc))
    args.faults = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
    if unknown := sorted(set(args.faults) - set(FAULTS)):
        parser.error(f"--faults {', '.join(unknown)}: not a fault; the faults: {', '.join(FAULTS)}")
    if "disk_full" in args.faults and os.geteuid() != 0:
        parser.error("--faults disk_full puts the state root on a tmpfs it mounts: run the soak "
                     "as root, or leave disk_full out of --faults")  # fmt: skip
    args.backoff_max_s = max(args.backoff, 60)
    with tempfile.TemporaryDirectory(prefix="dflash-soak-") as tmp:
        soak = Soak(args, Path(tmp))
        stop = {soak.root: lambda: run_playbook("playbooks/stop.yml", soak.common)}
        try:
            with stopped_at_exit(stop):
                ledger = soak.run()
        finally:
            soak.unmount()
    args.ledger.parent.mkdir(parents=True, exist_ok=True)
    args.ledger.write_text(json.dumps(ledger, indent=1) + "\n")
    print(summary(ledger))
    problems = check(ledger)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(f"ledger: {args.ledger}; {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
