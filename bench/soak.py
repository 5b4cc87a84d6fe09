"""A week in an hour: the whole toolkit on the local target for --duration under a seeded
schedule of real faults, with verify.yml every --verify-every as a cron job would run it; a
ledger of what was injected and what the toolkit said, checked afterwards (bench/soak_ledger.py).

    .venv/bin/python bench/soak.py --duration 1h --every 2m --seed 7 [--faults kill_trainer,hang]

The trainer (CPU, tiny model) comes from a git copy of this checkout's dflash/, tagged v1; a new
release is a real commit there. Faults: kill -9 of the trainer, SIGSTOP of it (a hang), kill -9
of the supervisor, a plain redeploy, a deploy of a new release, rollback.yml, kill -9 of a
deploy of a new release at a seeded moment then the plain rerun, history.jsonl's last line torn,
trainer.json removed. A fault the toolkit repairs itself (a crash, a hang) must be named by a
restart line and be stepping again within its bound; one that needs a person must be named by
the next verify, and its hint, run as printed, must put it back. The ledger goes to --ledger
(JSON); the summary table and every problem are printed; exit 1 when there is one.
Sequential: one fault at a time (the next waits until the last is recovered), and a verify
never overlaps a deploy (a cron's would: not judged here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from leftovers import stopped_at_exit  # noqa: E402
from soak_ledger import check, parse_span, schedule, summary  # noqa: E402

from tests.helpers import (  # noqa: E402
    dflash_package_files,
    git_source,
    playbook_command,
    playbook_env,
    run_playbook,
)
from tests.integration.conftest import add_release, read_json, tear_last_line  # noqa: E402

FAULTS = ("kill_trainer", "hang", "kill_supervisor", "redeploy", "new_release", "rollback",
          "kill_deploy", "torn_history", "trainer_json_removed")  # fmt: skip
# What a verify may name while a fault of this kind is open (not yet recovered).
EXPECTS = {
    "kill_trainer": ["trainer_down", "heartbeat_stale"],
    "hang": ["hung", "heartbeat_stale", "trainer_down"],
    "kill_supervisor": ["supervisor_gone"],
    "torn_history": ["history"],
    "trainer_json_removed": ["trainer_record"],
}
TRAINER = {"target_model": "tiny", "gen_samples": 16, "checkpoint_every": 20,
           "sleep_per_step": 0.2, "status_interval": 1}  # fmt: skip
# Steps the trainer may make between the soak's last look at status.json and the kill.
STEP_SLACK = int(TRAINER["status_interval"] / TRAINER["sleep_per_step"]) + 2


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.root = tmp / "root"
        self.root.mkdir()
        if (REPO / "sandbox" / "envs").is_dir():  # the demo's env, hard-linked: no env build
            subprocess.run(["cp", "-al", str(REPO / "sandbox" / "envs"), str(self.root / "envs")],
                           check=True)  # fmt: skip
        self.source = tmp / "source"
        git_source(self.source)("v1", dflash_package_files())
        self.releases = 1
        self.ref = "v1"
        self.verify_json = tmp / "verify.json"
        policy = {"backoff": args.backoff, "backoff_max": max(args.backoff, 60),
                  "max_restarts": 1000, "window": 3600}  # fmt: skip
        # tokens/s on a shared machine is noise: neither the gate nor verify judges it here.
        self.common = {
            "dflash_root": str(self.root), "dflash_source_dir": str(self.source),
            "dflash_verify_json": str(self.verify_json), "dflash_launch": True,
            "dflash_trainer_args": TRAINER, "dflash_restart_policy": policy,
            "dflash_hang_after": args.hang_after, "dflash_health_timeout": 300,
            "dflash_verify_min_throughput_ratio": 0, "dflash_verify_max_cpu_wait": 1,
            "dflash_min_throughput_ratio": 0, "dflash_stop_timeout": 30,
        }  # fmt: skip
        self.draw = random.Random(args.seed + 1)  # the moments inside a fault (a deploy's kill)
        self.started = time.monotonic()
        self.faults: list[dict[str, Any]] = []
        self.audits: list[dict[str, Any]] = []
        self.next_audit = 0.0
        self.injected_at = 0.0

    def say(self, text: str) -> None:
        print(f"[{self.now():7.0f} s] {text}", flush=True)

    def ledger(self) -> dict[str, Any]:
        """The ledger so far (written after every event: a soak cut short keeps it)."""
        runs = sorted((self.root / "runs").glob("*/supervisor.json"))
        return {
            "seed": self.args.seed, "duration_s": self.args.duration_s,
            "every_s": self.args.every_s, "faults": self.faults, "audits": self.audits,
            "history": self.history(),
            "goodput": {path.parent.name: (read_json(path) or {}).get("goodput", {})
                        for path in runs},
        }  # fmt: skip

    def save(self) -> None:
        self.args.ledger.parent.mkdir(parents=True, exist_ok=True)
        temp = self.args.ledger.with_suffix(".tmp")
        temp.write_text(json.dumps(self.ledger(), indent=1) + "\n")
        temp.replace(self.args.ledger)

    # --- what the target shows ---
    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

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

    def stepping(self, attempt_over: int = -1, release: str | None = None) -> bool:
        status = self.status()
        pid = status.get("pid")
        return (
            status.get("state") == "running"
            and status.get("attempt", 0) > attempt_over
            and status.get("step", 0) > (status.get("resumed_from_step") or 0)
            and (release is None or status.get("release") == release)
            and bool(pid) and os.path.exists(f"/proc/{pid}")
        )  # fmt: skip

    # --- what the soak runs ---
    def playbook(self, name: str, **extra: Any):
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

    def fault(self, kind: str, bound: float, **figures: Any) -> dict[str, Any]:
        fault = {"kind": kind, "at": self.now(), "bound_s": bound, "expects": EXPECTS.get(kind, []),
                 "detected": None, "recovered": None, **figures}  # fmt: skip
        fault["at"] = figures.get("at", fault["at"])
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
        current = (self.root / "current").resolve().name
        run = self.playbook("rollback.yml", dflash_release=current, dflash_restart=True)
        fault["put_back"] = {"at": self.now(), "rc": run.rc, "release": current}
        self.say(f"put back by rollback.yml -e dflash_release={current}: rc {run.rc}")
        self.save()

    def action(self, kind: str, run, release: str | None) -> None:
        """A deploy or rollback: done when it exits 0 and the expected release steps."""
        fault = self.fault(kind, 600, rc=run.rc, at=self.injected_at)
        if run.rc != 0:
            self.give_up(fault, f"exited {run.rc}: {run.output[-1500:]}")
            return
        self.mark(fault, "detected", by="rc 0")
        self.wait(lambda: self.stepping(release=release), 300)
        if self.stepping(release=release):
            self.mark(fault, "recovered", how=f"{self.status().get('release')} steps")
        else:
            self.give_up(fault, f"no trainer of {release or 'any release'} steps: {self.status()}")

    def wait(self, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check() and time.monotonic() < deadline:
            time.sleep(0.5)

    def inject(self, kind: str) -> None:
        self.injected_at = self.now()
        status = self.status()
        args = self.args
        if kind in ("kill_trainer", "hang") and not self.stepping():
            self.say(f"{kind} skipped: no trainer steps ({status.get('state')})")
        elif kind in ("kill_trainer", "hang"):
            bound = args.backoff_max_s + 180 + (args.hang_after if kind == "hang" else 0)
            self.fault(
                kind, bound, pid=status.get("pid"), attempt=status.get("attempt", 0),
                step_at_kill=status.get("step", 0), history_at=len(self.history()),
                checkpoint_at_kill=(status.get("checkpoint") or {}).get("step", 0),
                step_slack=STEP_SLACK,
            )  # fmt: skip
            os.kill(status["pid"], signal.SIGKILL if kind == "kill_trainer" else signal.SIGSTOP)
        elif kind == "kill_supervisor":
            supervisor = read_json(self.root / "runs" / "latest" / "supervisor.json")["pid"]
            self.fault(kind, args.verify_every_s + 600, pid=supervisor)
            os.kill(supervisor, signal.SIGKILL)
        elif kind == "torn_history":
            tear_last_line(self.root / "history.jsonl")
            self.fault(kind, args.verify_every_s + 600)
        elif kind == "trainer_json_removed":
            (self.root / "trainer.json").unlink()
            self.fault(kind, args.verify_every_s + 600)
        elif kind == "redeploy":
            self.action(kind, self.deploy(self.ref), self.ref)
        elif kind == "new_release":
            tag = self.new_commit()
            self.action(kind, self.deploy(tag), tag)
        elif kind == "rollback" and not (before := self.previous_release()):
            self.say("rollback skipped: history names no deployment before the current one")
        elif kind == "rollback":
            run = self.playbook("rollback.yml")
            if run.rc == 0:
                self.ref = before
            self.action(kind, run, before)
        elif kind == "kill_deploy":
            tag = self.new_commit()
            extravars = {**self.common, "dflash_ref": tag}
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            play = subprocess.Popen(
                playbook_command("deploy.yml", extravars), cwd=REPO, env=playbook_env(),
                start_new_session=True, **quiet,
            )  # fmt: skip
            moment = round(self.draw.uniform(1, 40), 1)
            time.sleep(moment)
            os.killpg(play.pid, signal.SIGKILL)
            play.wait()
            self.action(kind, self.deploy(tag), tag)
            self.faults[-1]["killed_after_s"] = moment

    # --- what the toolkit said ---
    def observe(self) -> None:
        """Restart lines name crashes and hangs; a stepping trainer of a later attempt is their
        recovery."""
        for fault in self.faults:
            if fault["kind"] not in ("kill_trainer", "hang") or fault["recovered"]:
                continue
            reason = "signal SIGKILL" if fault["kind"] == "kill_trainer" else "hung"
            lines = [x for x in self.restart_lines(fault["history_at"]) if x["reason"] == reason]
            if lines and not fault["detected"]:
                fault["restart_line"] = lines[0]
                self.mark(fault, "detected", by=f"restart line: {reason}")
            if fault["detected"] and self.stepping(attempt_over=fault["attempt"]):
                self.mark(fault, "recovered", how="the supervisor restarted it")

    def open_faults(self) -> list[dict[str, Any]]:
        return [f for f in self.faults if not f["recovered"] and "why" not in f]

    def audit(self) -> None:
        self.next_audit = self.now() + self.args.verify_every_s
        open_now = [{"kind": f["kind"], "expects": f["expects"]} for f in self.open_faults()]
        self.verify_json.unlink(missing_ok=True)
        run = self.playbook("verify.yml")
        host = (read_json(self.verify_json) or {}).get("hosts", {}).get("local", {})
        findings = host.get("findings", [])
        self.audits.append({"at": self.now(), "rc": run.rc, "verdict": host.get("verdict"),
                            "findings": [f["kind"] for f in findings],
                            "open_faults": open_now})  # fmt: skip
        self.say(f"verify: {host.get('verdict')} {[f['kind'] for f in findings] or ''}")
        self.save()
        for fault in self.open_faults():
            named = [f for f in findings if f["kind"] in fault["expects"]]
            if fault["kind"] in ("kill_trainer", "hang") or not named:
                continue
            if not fault["detected"]:
                self.mark(fault, "detected", by=f"verify: {named[0]['kind']}")
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
            self.wait(lambda: self.stepping(), 300)
        if run.rc == 0 and self.stepping():
            self.mark(fault, "recovered", how=f"the hint: {name} {extra}")
        else:
            self.give_up(fault, f"the hint {hint!r} exited {run.rc}: {run.output[-1500:]}")

    def settle(self, limit: float) -> None:
        """Observe, and audit on the schedule, until no fault is open or `limit` seconds pass."""
        deadline = time.monotonic() + limit
        while self.open_faults() and time.monotonic() < deadline:
            self.observe()
            if self.now() >= self.next_audit:
                self.audit()
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
        for at, kind in plan:
            while self.now() < at:
                self.observe()
                if self.now() >= self.next_audit:
                    self.audit()
                time.sleep(1)
            # One fault at a time: the next waits until the last is recovered (or given up).
            self.settle(args.backoff_max_s + args.hang_after + args.verify_every_s + 600)
            self.say(kind)
            self.inject(kind)
            self.save()
        self.settle(args.backoff_max_s + args.hang_after + args.verify_every_s + 600)
        self.wait(lambda: self.stepping(), 300)
        self.audit()
        last = self.audits[-1]
        end = {"verdict": last["verdict"], "findings": last["findings"],
               "stepping": self.stepping(), "release": self.status().get("release")}  # fmt: skip
        return {**self.ledger(), "end": end}


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
    args.backoff_max_s = max(args.backoff, 60)
    with tempfile.TemporaryDirectory(prefix="dflash-soak-") as tmp:
        soak = Soak(args, Path(tmp))
        stop = {soak.root: lambda: run_playbook("playbooks/stop.yml", soak.common)}
        with stopped_at_exit(stop):
            ledger = soak.run()
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
