"""`python -m dflash.supervise` over the real CPU trainer: a kill, a hang (SIGSTOP) and a trainer
that fails at every start, each provoked for real; a stop during the back-off; goodput."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from dflash.checkpoint_names import newest_step
from dflash.supervision.goodput import attempt_buckets, goodput
from dflash.supervision.record import Policy, RunRecord
from dflash.supervision.supervisor import descendants

from .conftest import FAST, REPO, argv, cli_env, read_status, wait_for_status

RUN_ID = "run-1"


class Supervised:
    """The supervisor as run.sh starts it: its own session, output into the run's train.log."""

    def __init__(
        self, root: Path, policy: list[str], trainer: list[str], wrap: list[str] = ()
    ) -> None:
        self.root = root
        self.run_dir = root / "runs" / RUN_ID
        self.run_dir.mkdir(parents=True)
        files = ["--checkpoint-dir", str(root / "checkpoints"), "--run-id", RUN_ID,
                 "--status-file", str(self.run_dir / "status.json")]  # fmt: skip
        trainer_command = [*wrap, sys.executable, "-m", "dflash.train", *trainer, *files]
        command = [sys.executable, "-m", "dflash.supervise", "--root", str(root), "--run-id",
                   RUN_ID, *policy, "--", *trainer_command]  # fmt: skip
        self.log = (self.run_dir / "train.log").open("wb")
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=cli_env(), stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def status(self, predicate, timeout: float = 120) -> dict:
        return wait_for_status(self.run_dir / "status.json", predicate, timeout)

    def record(self) -> dict:
        return read_status(self.run_dir / "supervisor.json") or {}

    def history(self) -> list[dict]:
        path = self.root / "history.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def text(self) -> str:
        return (self.run_dir / "train.log").read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


TRAINER = [*FAST, "--max-steps", "100000", "--checkpoint-every", "5", "--status-interval", "0.2",
           "--sleep-per-step", "0.05"]  # fmt: skip


@pytest.fixture
def supervised(tmp_path):
    started: list[Supervised] = []

    def start(policy: str, trainer: list[str] = TRAINER, wrap: list[str] = ()) -> Supervised:
        started.append(Supervised(tmp_path / f"root{len(started)}", argv(policy), trainer, wrap))
        return started[-1]

    yield start
    for item in started:
        item.close()


def running_past(step: int, attempt: int):
    return lambda s: s.get("attempt") == attempt and s.get("state") == "running" and (
        s.get("step", 0) > step
    )  # fmt: skip


def assert_goodput_adds_up(record: dict) -> None:
    good = record["goodput"]
    parts = good["productive_s"] + sum(good["badput_s"].values())
    assert parts == pytest.approx(good["wall_s"], abs=0.01), good
    assert all(value >= 0 for value in good["badput_s"].values()), good
    assert 0 <= good["ratio"] <= 1


def test_a_killed_trainer_is_back_from_its_checkpoint_and_the_restart_recorded(supervised):
    run = supervised("--backoff 1 --hang-after 600")
    first = run.status(running_past(7, 0))
    killed_at = time.time()
    os.kill(first["pid"], signal.SIGKILL)
    back = run.status(running_past(0, 1), timeout=180)
    assert back["pid"] != first["pid"] and back["resumed_from_step"] > 0
    assert back["resumed_from_step"] <= first["step"]
    deadline = time.monotonic() + 30
    while not run.history() and time.monotonic() < deadline:
        time.sleep(0.1)
    [line] = run.history()
    assert (line["action"], line["result"]) == ("restart", "restarted")
    assert line["reason"] == "signal SIGKILL"
    assert line["run_id"] == RUN_ID and line["resumed_from_step"] == back["resumed_from_step"]
    assert line["steps_lost"] == line["step"] - line["checkpoint_step"] >= 0
    assert 0 < line["time_to_first_step_s"] < time.time() - killed_at + 1
    record = run.record()
    assert record["state"] == "running" and record["restarts"]["count"] == 1
    assert record["restarts"]["last_reason"] == "signal SIGKILL"
    assert [a["end_reason"] for a in record["attempts"][:1]] == ["crash"]
    assert_goodput_adds_up(record)
    assert record["goodput"]["badput_s"]["down"] >= 1  # the back-off
    assert record["goodput"]["badput_s"]["startup"] > 0
    assert record["goodput"]["productive_s"] > 0  # the steps up to its checkpoint were kept
    # SIGTERM (stop.yml, a deploy): the trainer checkpoints and stops; nothing restarts.
    os.killpg(run.proc.pid, signal.SIGTERM)
    assert run.proc.wait(timeout=60) == 0
    assert run.record()["state"] == "stopped" and len(run.history()) == 1
    assert read_status(run.run_dir / "status.json")["state"] == "stopped"


def test_a_hung_trainer_has_its_stacks_dumped_and_is_restarted(supervised):
    run = supervised("--backoff 1 --hang-after 4")
    first = run.status(running_past(3, 0))
    os.kill(first["pid"], signal.SIGSTOP)  # alive, but no step will come
    back = run.status(running_past(0, 1), timeout=180)
    assert back["pid"] != first["pid"]
    log = run.text()
    assert "supervisor: hung: no step for" in log
    # faulthandler's dump of the frozen trainer: its main thread inside the training loop.
    dump = log.split("supervisor: hung:")[1]
    assert "Thread 0x" in dump and "dflash/train.py" in dump and "in train" in dump
    record = run.record()
    assert record["attempts"][0]["end_reason"] == "hung"
    assert record["attempts"][0]["hang_dump"] == str(run.run_dir / "train.log")
    assert record["restarts"]["last_reason"] == "hung"
    assert_goodput_adds_up(record)
    assert record["goodput"]["badput_s"]["hang"] >= 4


def test_a_checkpoint_save_that_never_ends_is_a_hang_and_restarted(supervised):
    """A save stuck in its storage (a dead NFS server) keeps the heartbeat beating and makes no
    step: judged by the save limit (--hang-after given, or 10 times the run's longest save)."""
    stuck = [*TRAINER, "--sleep-in-checkpoint", "3600"]
    run = supervised("--backoff 1 --hang-after 4", stuck)
    saving = run.status(lambda s: s.get("attempt") == 0 and s.get("state") == "checkpointing")
    assert saving["state_is"] == ["alive", "training", "stepping", "saving"]
    assert saving["checkpoint_started_at"]
    back = run.status(lambda s: s.get("attempt") == 1, timeout=180)
    assert back["pid"] != saving["pid"]
    log = run.text()
    assert f"supervisor: hung: the checkpoint save at step {saving['step']} has run " in log
    dump = log.split("supervisor: hung:")[1]
    assert "in save_checkpoint" in dump  # faulthandler's stacks: inside the save
    record = run.record()
    assert record["attempts"][0]["end_reason"] == "hung"
    assert record["save_limit_s"] == 4.0  # no save has ended yet: the hang limit given
    assert_goodput_adds_up(record)


def test_a_trainer_failing_at_every_start_ends_in_a_crash_loop(supervised):
    # GPUs 0 and 1 as target and drafter: no such GPUs here (CUDA missing, or one GPU).
    broken = [*FAST, "--max-steps", "10", "--target-gpus", "0", "--drafter-gpus", "1"]
    # (--backoff-max well above a failed start's few seconds, however loaded the machine: a
    # trainer that ran longer than it would start the doubling anew)
    run = supervised("--max-restarts 2 --backoff 1 --backoff-max 60", broken)
    assert run.proc.wait(timeout=300) != 0
    record = run.record()
    assert record["state"] == "crash_loop" and record["restarts"]["count"] == 2
    assert len(record["attempts"]) == 3
    assert record["last_error"].startswith("exit code 2: --")
    lines = run.history()
    assert [line["result"] for line in lines] == ["failed", "failed", "crash_loop"]
    assert lines[-1]["restarts_in_window"] == 2 and lines[-1]["reason"] == "exit code 2"
    assert "crash loop: the trainer ended (exit code 2: " in run.text()
    # The waits doubled: 1 s, then 2 s, all of it down time.
    assert record["goodput"]["badput_s"]["down"] >= 3 and record["goodput"]["productive_s"] == 0


def test_restart_lines_name_the_checkpoint_on_disk_the_error_and_the_release(supervised, tmp_path):
    """A trainer that checkpointed, was killed, and then fails at every start before it writes
    its status.json (as on a store truncated under it): every restart line names the newest
    checkpoint on disk (not the failed start's none), the error the start printed, and the
    release, and the supervisor's log line says the same checkpoint."""
    broken = tmp_path / "broken"
    fail = f"raise ValueError('the store {broken} is truncated')"
    script = f'if [ -e "{broken}" ]; then exec "{sys.executable}" -c "{fail}"; fi; exec "$@"'
    run = supervised(
        "--max-restarts 2 --backoff 1 --backoff-max 60 --hang-after 600",
        wrap=["sh", "-c", script, "trainer"],
    )
    first = run.status(running_past(6, 0))
    checkpoints = run.root / "checkpoints"
    deadline = time.monotonic() + 60
    while (newest_step(checkpoints) or 0) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    broken.touch()
    os.kill(first["pid"], signal.SIGKILL)
    assert run.proc.wait(timeout=300) != 0
    saved = newest_step(checkpoints)
    assert saved is not None and saved >= 5
    lines = run.history()
    assert [(line["result"], line["reason"]) for line in lines] == [
        ("failed", "signal SIGKILL"), ("failed", "exit code 1"), ("crash_loop", "exit code 1"),
    ]  # fmt: skip
    assert [line["checkpoint_step"] for line in lines] == [saved] * 3, lines
    assert lines[0]["steps_lost"] == lines[0]["step"] - saved >= 0
    assert [line["steps_lost"] for line in lines[1:]] == [0, 0]
    error = f"ValueError: the store {broken} is truncated"
    assert [line["error"] for line in lines] == [None, error, error]
    assert [line["release"] for line in lines] == ["unreleased"] * 3
    assert f"its last checkpoint at step {saved}" in run.text()
    assert run.record()["last_error"] == f"exit code 1: {error}"


def fill(disk: Path, log_fd: int) -> Path:
    """Write zeros to `disk` until it has no room left, then newlines to the trainer's log
    through its own open file (its offset, which the supervisor and trainer share) until its
    last page is full too: a file system gives a file's last page out byte by byte. The file
    that holds the zeros."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    for out, chunk in ((fd, b"\0" * (1 << 16)), (log_fd, b"\n")):
        try:
            while os.write(out, chunk):
                pass
        except OSError:
            pass  # ENOSPC: full
    os.close(fd)
    return filler


def test_a_full_disk_does_not_end_the_supervisor(tmpfs, tmp_path):
    """train.log, supervisor.json and the checkpoints on a disk filled to the last byte: the
    trainer killed then has its end, its restart and their log lines refused by the disk; the
    supervisor loses the lines, not its life, and restarts the trainer, which runs once there is
    room again. (It died on its own log line: the trainer ran on unsupervised.)"""
    disk = tmpfs("64m")
    run = Supervised(disk / "root", argv("--backoff 1 --max-restarts 20 --hang-after 600"), TRAINER)
    try:
        first = run.status(running_past(3, 0))
        # Stopped first: a checkpoint save that meets the full disk frees its temp file.
        os.kill(first["pid"], signal.SIGSTOP)
        filler = fill(disk, run.log.fileno())
        os.kill(first["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 120

        def new_trainer() -> set[int]:
            return set(descendants(run.proc.pid)) - {first["pid"]}

        while time.monotonic() < deadline and not new_trainer():
            assert run.proc.poll() is None, "the supervisor died on the full disk"
            time.sleep(0.1)
        assert new_trainer(), "no trainer started on the full disk"
        filler.unlink()
        back = run.status(lambda s: s.get("attempt", 0) >= 1 and s.get("state") == "running"
                          and s.get("step", 0) > 0, timeout=180)  # fmt: skip
        assert back["pid"] != first["pid"] and run.proc.poll() is None
        record = run.record()
        assert record["state"] == "running" and record["restarts"]["count"] >= 1
        assert not list(run.run_dir.glob(".supervisor.json.*.tmp")), "a cut temp file was left"
    finally:
        run.close()


def test_a_freeze_of_the_supervisor_with_its_trainer_is_no_hang(supervised):
    """The supervisor and its trainer stopped together (a container frozen for a backup in
    suspend mode, or by `pct freeze`) for longer than --hang-after, then thawed, the trainer a
    little after the supervisor (its next step takes a while): the trainer trains on, not
    killed as hung. (The supervisor judged it hung at once on its thaw.)"""
    run = supervised("--backoff 1 --hang-after 10")
    first = run.status(running_past(3, 0))
    os.killpg(run.proc.pid, signal.SIGSTOP)
    time.sleep(15)  # the freeze itself: longer than the hang limit
    os.kill(run.proc.pid, signal.SIGCONT)
    time.sleep(2)  # the trainer's first step after the thaw, well within the limit
    os.killpg(run.proc.pid, signal.SIGCONT)
    same_trainer_on = first["step"] + 10
    later = run.status(
        lambda s: s.get("pid") == first["pid"] and s.get("step", 0) >= same_trainer_on, timeout=120
    )
    assert later["attempt"] == 0
    record = run.record()
    assert record["restarts"]["count"] == 0 and len(record["attempts"]) == 1, record
    assert "the supervisor did not run for" in run.text()
    assert "hung: no step for" not in run.text()


def test_a_stop_during_the_back_off_starts_nothing(supervised):
    run = supervised("--backoff 60 --hang-after 600")
    first = run.status(running_past(1, 0))
    os.kill(first["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while run.record().get("state") != "backoff" and time.monotonic() < deadline:
        time.sleep(0.1)
    waiting = run.record()
    assert waiting["state"] == "backoff"
    # When the next start comes (verify's trainer_down finding says it): ~60 s from now.
    until = datetime.fromisoformat(waiting["backoff_until"]).timestamp()
    assert 30 < until - time.time() <= 60, waiting["backoff_until"]
    os.killpg(run.proc.pid, signal.SIGTERM)
    assert run.proc.wait(timeout=30) == 0
    record = run.record()
    assert record["state"] == "stopped" and len(record["attempts"]) == 1
    assert record["restarts"]["count"] == 0 and run.history() == []


def test_goodput_buckets_follow_the_attempts():
    def at(seconds: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(seconds))

    crashed = {"started": 100, "ended": 200, "end_reason": "crash", "first_step_at": at(130),
               "last_step_at": at(195), "checkpoint_at": at(180),
               "checkpoint_seconds": 4}  # fmt: skip
    assert attempt_buckets(crashed, now=1000) == {
        "productive": 46, "startup": 30, "checkpoint": 4, "lost": 20, "hang": 0, "down": 0,
    }  # fmt: skip
    hung = {**crashed, "end_reason": "hung"}
    assert attempt_buckets(hung, now=1000) | {"hang": 5, "lost": 15} == attempt_buckets(hung, 1000)
    never = {"started": 210, "ended": 220, "end_reason": "crash"}
    running = {"started": 230, "first_step_at": at(250), "checkpoint_seconds": 2}
    result = goodput([crashed, never, running], started=90, now=300)
    assert result["wall_s"] == 210
    assert result["badput_s"] == {"startup": 30 + 10 + 20, "checkpoint": 4 + 2, "lost": 20,
                                  "hang": 0, "down": 10 + 10 + 10}  # fmt: skip
    assert result["productive_s"] == 46 + 48
    assert result["ratio"] == pytest.approx(94 / 210, abs=1e-4)


def test_a_checkpoint_saved_in_the_hang_dump_window_is_kept_work(tmp_path):
    """A hung trainer is continued for its stack dump and may finish its step and save a
    checkpoint before the kill (seen: step 590 saved in the 3 s window, the restart line said
    580, goodput counted 15.5 s lost). The record, on its real files, keeps that checkpoint:
    nothing lost, the hang's own time still the hang's."""
    from dflash.supervision.files import utc_text, write_atomic

    record = RunRecord(Policy(5, 3600, 1, 60, 4), tmp_path, "r1", tmp_path / "checkpoints")
    record.run_dir.mkdir(parents=True)
    attempt = record.begin()
    t0 = attempt["started"] = time.time() - 50  # started 50 s ago; killed now
    seen = {"run_id": "r1", "attempt": 0, "state": "running", "step": 589,
            "first_step_at": utc_text(t0 + 10), "last_step_at": utc_text(t0 + 40),
            "checkpoint": {"step": 580, "at": utc_text(t0 + 25)}}  # fmt: skip
    write_atomic(record.status_path, seen)
    record.observe(read_status(record.status_path))
    # The dump window: continued, it finished step 590 and saved it, then was killed.
    saved = {"step": 590, "at": utc_text(t0 + 46)}
    dump_window = {**seen, "step": 590, "last_step_at": utc_text(t0 + 46), "checkpoint": saved}
    write_atomic(record.status_path, dump_window)
    record.end(-9, "hung")
    ended = record.attempts[0]
    assert ended["checkpoint_step"] == 590
    assert ended["last_step_at"] == utc_text(t0 + 40)  # the hang counts from the last step seen
    buckets = attempt_buckets(ended, now=ended["ended"])
    assert buckets["lost"] == 0
    assert buckets["hang"] == pytest.approx(ended["ended"] - (t0 + 40), abs=1.0)
    restart = record.note_restart(-9, "hung")
    assert (restart["checkpoint_step"], restart["steps_lost"]) == (590, 0)


def test_a_trainer_that_cannot_even_be_started_is_a_crash_loop_too(tmp_path):
    """Its interpreter removed by hand: every start fails at once; the supervisor lives on."""
    root = tmp_path / "root"
    (root / "runs" / RUN_ID).mkdir(parents=True)
    gone = str(tmp_path / "gone" / "python")
    command = [sys.executable, "-m", "dflash.supervise", "--root", str(root), "--run-id", RUN_ID,
               "--max-restarts", "1", "--backoff", "1", "--", gone]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 127, done.stdout + done.stderr
    record = read_status(root / "runs" / RUN_ID / "supervisor.json")
    assert record["state"] == "crash_loop" and len(record["attempts"]) == 2
    assert record["last_error"].startswith("exit code 127: cannot start: [Errno 2]")
    lines = [json.loads(x) for x in (root / "history.jsonl").read_text().splitlines()]
    assert [line["result"] for line in lines] == ["failed", "crash_loop"]


def test_the_back_off_doubles_for_failures_in_a_row_and_starts_anew_after_a_long_run(tmp_path):
    record = RunRecord(Policy(5, 3600, 10, 300, None), tmp_path, RUN_ID)
    record.attempts = [
        {"started": 0, "ended": 1000, "end_reason": "crash"},  # trained 1000 s, then crashed
        {"started": 1010, "ended": 1020, "end_reason": "crash"},  # failed soon after its start
        {"started": 1040, "ended": 1050, "end_reason": "hung"},
    ]
    assert record.quick_failures() == 3
    assert [record.policy.backoff(n) for n in (1, 2, 3, 4, 9)] == [10, 20, 40, 80, 300]
    record.attempts.append({"started": 1100, "ended": 1500, "end_reason": "crash"})
    assert record.quick_failures() == 1  # a crash a day waits the first back-off


def test_the_save_limit_is_the_hang_limit_given_or_ten_longest_saves():
    given = Policy(max_restarts=5, window_s=3600.0, backoff_s=1.0, backoff_max_s=60.0,
                   hang_after_s=30.0)  # fmt: skip
    auto = Policy(max_restarts=5, window_s=3600.0, backoff_s=1.0, backoff_max_s=60.0,
                  hang_after_s=None)  # fmt: skip
    assert given.save_limit(0.0) == 30.0 and given.save_limit(12.0) == 120.0
    # auto: a first save on slow storage gets 15 minutes, a run whose saves take 2 min 20.
    assert auto.save_limit(0.0) == 900.0 and auto.save_limit(120.0) == 1200.0
