"""Converge from what a fault or a person leaves: deploys killed at each step, two deploys at
once, a release edited by hand, `current` replaced by a folder, a SIGSTOPped trainer. Every
fault is made for real on the local target with the real trainer; the next plain run must
finish the job (or name what happened), and the one after it must change nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, playbook_command, playbook_env
from tests.integration.conftest import (
    TRAINER_ARGS,
    add_release,
    alive,
    is_trainer,
    read_json,
    status_of,
)

# A health wait long enough for a kill to land inside it: 12 steps of at least 0.5 s, with
# status.json rewritten every 0.5 s, so the test sees the trainer running and not yet proven.
HEALTH_STEPS = 12
SLOW_ENOUGH = {**TRAINER_ARGS, "gen_samples": 16, "sleep_per_step": 0.5, "status_interval": 0.5}


def history(root: Path) -> list[dict]:
    path = root / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def each_process(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, /proc/<pid>/<name>) of every live process that still has it."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield int(entry), Path(f"/proc/{entry}/{name}").read_bytes()
            except OSError:
                continue


def process_table() -> dict[int, tuple[int, int]]:
    """Every live process's parent and process group, from /proc."""
    table = {}
    for pid, stat in each_process("stat"):
        fields = stat.rsplit(b")", 1)[1].split()
        table[pid] = (int(fields[1]), int(fields[2]))
    return table


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (the playbook's workers and the modules they run)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in process_table().items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def group_members(pgid: int) -> set[int]:
    """Every live process of the process group `pgid` (a worker forked or a module started after
    the kill's snapshot of the tree still belongs to the playbook's group)."""
    return {pid for pid, (_, group) in process_table().items() if group == pgid}


PLAY_MARKER = "DFLASH_TEST_PLAY"


def marked(marker: str) -> set[int]:
    """Every live process whose environment carries `marker` (PLAY_MARKER's value): a play's
    workers leave its process group (ansible-core's workers call setsid) but keep its env."""
    wanted = f"{PLAY_MARKER}={marker}".encode()
    return {pid for pid, environ in each_process("environ") if wanted in environ.split(b"\0")}


def orphans(pids: set[int], root: Path, play: subprocess.Popen | None = None) -> list[int]:
    """Which of a killed run's processes still live, its trainer (which is meant to) aside:
    those seen below it when it was killed, and any of `play` (started by `start`) forked after
    that: in its process group, or in a session of their own with its environment."""
    if play is not None:
        pids = pids | group_members(play.pid) | marked(play.marker)
    return sorted(p for p in pids if alive(p) and not is_trainer(p, root))


def start(variables: dict) -> subprocess.Popen:
    """The playbook in a process group of its own (as a shell's job is), its environment marked
    (`marker`), so what it forks after the kill's snapshot is still found."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        playbook_command("deploy.yml", variables), cwd=REPO,
        env=playbook_env({PLAY_MARKER: marker}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1, process_group=0,
    )  # fmt: skip
    proc.marker = marker  # type: ignore[attr-defined]
    return proc


def wait_for(condition, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def kill_at(proc: subprocess.Popen, banner: str, condition=None) -> tuple[str, set[int]]:
    """SIGKILL ansible-playbook (its pid only, as `kill -9 PID` does) once the task `banner`
    has started and `condition()` holds; returns its output and what ran below it."""
    output = []
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        if banner in line:
            break
    else:
        raise AssertionError(f"the deploy ended before '{banner}':\n{''.join(output)}")
    if condition is not None:
        assert wait_for(condition), f"never got to the point to kill at '{banner}'"
    below = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return "".join(output), below


def new_run_started(root: Path, before: str | None):
    return lambda: (read_json(root / "trainer.json") or {}).get("run_id") not in (None, before)


def training_not_healthy(root: Path, before: str | None):
    def check() -> bool:
        status = status_of(root)
        # Steps of this run: a restarted trainer resumes its checkpoint's step count.
        done = status.get("step", 0) - (status.get("resumed_from_step") or 0)
        return (
            new_run_started(root, before)()
            and status.get("state") == "running"
            and 1 <= done < HEALTH_STEPS
        )

    return check


@pytest.fixture
def stopped_after(playbook):
    """stop.yml once the test is done, passed or failed: no trainer outlives it."""
    yield
    playbook("playbooks/stop.yml", dflash_stop_timeout=20)


@pytest.mark.timeout(3600)  # ~15 min on a loaded 2-core machine: twice the suite's limit
def test_kill_9_at_each_step_then_a_plain_rerun_converges(
    trainer_repo, playbook, target_root, stopped_after
):
    base = {
        "dflash_source_dir": str(trainer_repo),
        "dflash_launch": True,
        "dflash_trainer_args": SLOW_ENOUGH,
        "dflash_health_timeout": 240,
        "dflash_health_steps": HEALTH_STEPS,
    }
    first = playbook("deploy.yml", dflash_ref="v1", **base)
    assert first.rc == 0, first.output
    root = target_root
    points = [
        ("unpack", "TASK [dflash_release : Unpack the release", None),
        ("switch", "TASK [dflash_activate : Make the release current",
         lambda tag, run: lambda: os.readlink(root / "current") == f"releases/{tag}"),
        ("launch", "TASK [dflash_launch : Check the files, stop every old trainer",
         lambda tag, run: new_run_started(root, run)),
        ("health wait", "TASK [dflash_launch : Check the files, stop every old trainer",
         lambda tag, run: training_not_healthy(root, run)),
        ("record", "TASK [dflash_record : Record the deployment", None),
    ]  # fmt: skip
    for number, (point, banner, condition) in enumerate(points, start=2):
        tag = f"v{number}"
        add_release(trainer_repo, tag, "dflash/__init__.py", f"# {tag}\n")
        before_run = (read_json(root / "trainer.json") or {}).get("run_id")
        variables = {
            **base, "dflash_root": str(root), "dflash_ref": tag,
            "dflash_verify_json": str(root.parent / "verify.json"),
            "dflash_min_throughput_ratio": 0,
        }  # fmt: skip
        when = condition(tag, before_run) if condition else None
        killed = start(variables)
        killed_output, below = kill_at(killed, banner, when)
        lock = read_json(root / ".deploy.lock")
        assert lock is not None, f"{point}: the killed run left no lock to recognise it by"

        # Whatever the killed run left running below it ends with it (no orphan module).
        gone = lambda below=below, play=killed: not orphans(below, root, play)  # noqa: E731
        assert wait_for(gone, 120), (
            f"{point}: processes of the killed run outlived it: {orphans(below, root, killed)}"
        )
        if point != "record":  # (a kill at the record step may leave nothing interrupted)
            # Named, not passed: the interrupted run.
            verify = playbook("verify.yml")
            states = [f.get("state") for f in verify.report["hosts"]["local"]["findings"]]
            assert verify.rc != 0 and "interrupted" in states, (point, verify.output)

        # Killed at its banner, the record module may still finish below the dead play (a
        # short write whose last act gives the lock up): then nothing is left to take over.
        recorded_below = point == "record" and not (root / ".deploy.lock").exists()
        rerun = playbook("deploy.yml", dflash_ref=tag, **base)
        assert rerun.rc == 0, (point, killed_output, rerun.output)
        if recorded_below:
            assert "took over" not in rerun.text and rerun.changed() == 0, rerun.output
        else:
            assert "took over the deploy lock" in rerun.text, (point, rerun.output)
        again = playbook("deploy.yml", dflash_ref=tag, **base)
        assert again.rc == 0 and again.changed() == 0, (point, again.output)
        verify = playbook("verify.yml")
        assert verify.rc == 0, (point, verify.output)

        # History is complete and true: the running trainer's run is recorded once, healthy.
        running = read_json(root / "trainer.json")
        assert alive(running["pid"]) and status_of(root)["release"] == tag, point
        lines = [e for e in history(root) if e.get("run_id") == running["run_id"]]
        assert [(e["release"], e["result"]) for e in lines] == [(tag, "healthy")], (point, lines)
        assert not (root / ".deploy.lock").exists(), point


def test_two_deploys_at_once_end_with_one_winner(trainer_repo, deploy, target_root):
    assert deploy("v1").rc == 0
    for tag in ("v2", "v3"):
        add_release(trainer_repo, tag, "dflash/__init__.py", f"# {tag}\n")
    variables = {
        "dflash_root": str(target_root), "dflash_source_dir": str(trainer_repo),
        "dflash_launch": True, "dflash_trainer_args": TRAINER_ARGS,
        "dflash_health_timeout": 180, "dflash_min_throughput_ratio": 0,
    }  # fmt: skip
    runs = {tag: start({**variables, "dflash_ref": tag}) for tag in ("v2", "v3")}
    outputs = {tag: proc.communicate()[0] for tag, proc in runs.items()}
    codes = {tag: proc.returncode for tag, proc in runs.items()}
    assert sorted(codes.values())[0] == 0 and sorted(codes.values())[1] != 0, outputs
    winner = next(tag for tag, code in codes.items() if code == 0)
    loser = next(tag for tag, code in codes.items() if code != 0)
    # The loser was told who holds the lock, and changed nothing.
    told = " ".join(outputs[loser].split())
    assert "is locked by deploy of" in told and "pid" in told, outputs[loser]
    assert loser not in [e["release"] for e in history(target_root)]
    # One trainer, of the winner, and history says exactly that.
    record = read_json(target_root / "trainer.json")
    assert status_of(target_root)["release"] == winner and alive(record["pid"])
    last = history(target_root)[-1]
    assert (last["release"], last["run_id"]) == (winner, record["run_id"])
    assert deploy(winner).changed() == 0


def test_hand_edited_release_is_put_back_by_a_redeploy(deploy, playbook, target_root):
    assert deploy("v1").rc == 0
    edited = target_root / "current" / "dflash" / "model.py"
    edited.write_text(edited.read_text() + "\n# edited on the target\n")
    drift = playbook("verify.yml")
    assert drift.rc != 0 and any(
        f["kind"] == "code" and f["path"] == "dflash/model.py"
        for f in drift.report["hosts"]["local"]["findings"]
    ), drift.output
    old_pid = read_json(target_root / "trainer.json")["pid"]

    redeploy = deploy("v1")
    assert redeploy.rc == 0, redeploy.output
    assert "had been edited" in redeploy.text and "dflash/model.py" in redeploy.text
    # The trainer that may have read the edit was restarted on the repaired code.
    assert read_json(target_root / "trainer.json")["pid"] != old_pid
    assert "# edited on the target" not in edited.read_text()
    [kept] = (target_root / "releases").glob(".edited-v1-*")
    assert "# edited on the target" in (kept / "dflash" / "model.py").read_text()
    assert playbook("verify.yml").rc == 0
    assert [e["result"] for e in history(target_root)] == ["healthy", "healthy"]


def test_current_replaced_by_a_folder_is_moved_aside(deploy, playbook, target_root):
    assert deploy("v1").rc == 0
    current = target_root / "current"
    release = current.resolve()
    current.unlink()
    shutil.copytree(release, current)
    found = playbook("verify.yml")
    assert found.rc != 0 and "not a link" in found.text, found.output

    repaired = deploy("v1")
    assert repaired.rc == 0, repaired.output
    assert current.is_symlink() and os.readlink(current) == "releases/v1"
    [aside] = target_root.glob("current.replaced-*")
    assert (aside / "MANIFEST.json").exists() and "moved to" in repaired.text
    assert not list(target_root.glob(".tmp-current-*"))
    assert playbook("verify.yml").rc == 0


def test_sigstopped_trainer_is_restarted_cleanly(deploy, target_root):
    assert deploy("v1").rc == 0
    record = read_json(target_root / "trainer.json")
    os.killpg(record["pid"], signal.SIGSTOP)
    # Same release, same run.sh: only the stopped trainer makes this a restart.
    again = deploy("v1", dflash_stop_timeout=120)
    assert again.rc == 0, again.output
    assert "is stopped (SIGSTOP)" in again.text, again.output
    # SIGCONT came before SIGTERM: it checkpointed and exited instead of being killed.
    assert "killed (SIGKILL)" not in again.text and "stopped on SIGTERM" in again.text
    assert not alive(record["pid"])
    assert read_json(target_root / "trainer.json")["pid"] != record["pid"]
    assert list((target_root / "checkpoints").glob("*.pt")), "no checkpoint on SIGTERM"


def test_a_launch_whose_playbook_was_killed_while_stopping_starts_nothing(
    deploy, playbook, trainer_repo, target_root
):
    """The launch runs in the background (async): killed while the old trainer stops, the play
    leaves that job running on the target. Once the stop is done it must not start the new
    trainer for a play that is gone; the plain rerun takes over and starts it."""
    assert deploy("v1").rc == 0
    old = read_json(target_root / "trainer.json")
    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2\n")
    # A process of the run (the marker run.sh exports) that ignores SIGTERM: the stop of the
    # old trainers lasts the whole stop timeout, and the kill lands inside it.
    deaf = subprocess.Popen(
        ["python3", "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        env=dict(os.environ, DFLASH_ROOT=os.path.realpath(target_root)),
    )  # fmt: skip
    variables = {
        "dflash_root": str(target_root), "dflash_source_dir": str(trainer_repo),
        "dflash_ref": "v2", "dflash_launch": True, "dflash_trainer_args": TRAINER_ARGS,
        "dflash_health_timeout": 180, "dflash_stop_timeout": 15,
    }  # fmt: skip
    jobs_before = set(Path("~/.ansible_async").expanduser().glob("*"))
    try:
        # Killed once the old trainer is gone and the deaf one still holds the stop up.
        kill_at(start(variables), "TASK [dflash_launch : Check the files, stop every old trainer",
                lambda: not alive(old["pid"]))  # fmt: skip
        assert deaf.wait(timeout=60) == -signal.SIGKILL  # the orphaned job's stop went on
    finally:
        if deaf.poll() is None:
            deaf.kill()

    def orphans_result() -> dict | None:
        for path in set(Path("~/.ansible_async").expanduser().glob("*")) - jobs_before:
            result = read_json(path) or {}
            if str(target_root) in str(result.get("msg", "")):
                return result
        return None

    assert wait_for(lambda: orphans_result() is not None, 60), "the orphaned launch never ended"
    said = " ".join(orphans_result()["msg"].split())
    assert "has died" in said and "not going on to start the trainer of release v2" in said
    # Nothing was started for the dead play: no run of v2, no trainer of the root.
    assert not [p for p in (target_root / "runs").iterdir() if p.name.endswith("-v2")]
    assert (read_json(target_root / "trainer.json") or {}).get("run_id") == old["run_id"]
    assert not any(is_trainer(int(p), target_root) for p in os.listdir("/proc") if p.isdigit())

    rerun = playbook("deploy.yml", **{k: v for k, v in variables.items() if k != "dflash_root"})
    assert rerun.rc == 0 and "took over the deploy lock" in rerun.text, rerun.output
    assert status_of(target_root)["release"] == "v2"
    assert playbook("verify.yml").rc == 0
