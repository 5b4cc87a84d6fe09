"""callback_plugins/dflash.py: waits render as progress lines (how often, counted from when),
an ok result shows only when it says something, a failure shows once; ansible-doc renders it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ansible.executor.task_result import CallbackTaskResult
from ansible.inventory.host import Host
from ansible.playbook.task import Task
from ansible.plugins.loader import callback_loader, init_plugin_loader

from tests.helpers import REPO

ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
# A clock the test moves: each progress line's seconds are the test's.
Clock = Callable[[float], None]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    now = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: now[0])

    def move_to(seconds: float) -> None:
        now[0] = 1000.0 + seconds

    return move_to


@pytest.fixture(scope="module")
def loader() -> None:
    init_plugin_loader()
    callback_loader.add_directory(str(REPO / "callback_plugins"))


@pytest.fixture
def screen(loader: None) -> tuple[Any, list[str]]:
    """The callback as ansible.cfg sets it (ok and skipped results hidden), printing to a list."""
    callback = callback_loader.get("dflash")
    callback.set_options(direct={"display_ok_hosts": False, "display_skipped_hosts": False,
                                 "progress_interval": 30, "result_format": "yaml"})  # fmt: skip
    lines: list[str] = []
    callback._display.display = lambda msg, **kw: lines.extend(str(msg).splitlines())
    callback._display.banner = lambda msg, **kw: lines.append(msg)
    callback._display.verbosity = 0
    return callback, lines


def task(name: str, action: str, **args: Any) -> Task:
    return Task.load({"name": name, action: args})


def result(of: Task, data: dict[str, Any], **fields: Any) -> CallbackTaskResult:
    return CallbackTaskResult(Host("gpu-1"), of, data, fields)


def test_an_async_wait_prints_progress_from_its_jobs_start_not_retry_lines(screen, clock):
    callback, lines = screen
    start = task("Start the build", "ansible.builtin.command", cmd="true")
    wait = task("Wait for the build", "ansible.builtin.async_status", jid="j1")
    callback.v2_runner_on_start(Host("gpu-1"), start)
    clock(1)
    running = {"ansible_job_id": "j1", "started": True, "finished": False, "changed": False}
    callback.v2_runner_on_ok(result(start, running, async_val=300))
    assert lines == []  # an ok result that says nothing
    callback.v2_runner_on_start(Host("gpu-1"), wait)
    # Polled every 5 s for 100 s: a line at the first poll, then each time the wait has lasted
    # twice as long, then every 30 s.
    for second in range(3, 100, 5):
        clock(second)
        callback.v2_runner_retry(result(wait, {**running, "retries": 62, "attempts": 1}, delay=5))
    assert lines == [
        "TASK [Wait for the build]",
        "[gpu-1] still waiting: 3 s (at most 300 s)",
        "[gpu-1] still waiting: 8 s (at most 300 s)",
        "[gpu-1] still waiting: 18 s (at most 300 s)",
        "[gpu-1] still waiting: 38 s (at most 300 s)",
        "[gpu-1] still waiting: 68 s (at most 300 s)",
        "[gpu-1] still waiting: 98 s (at most 300 s)",
    ]


def test_an_async_poll_is_progress_under_its_task_with_no_async_lines(screen, clock):
    callback, lines = screen
    warm = Task.load({"name": "Compile", "ansible.builtin.command": {"cmd": "true"},
                      "async": 600, "poll": 5})  # fmt: skip
    callback.v2_runner_on_start(Host("gpu-1"), warm)
    running = {"ansible_job_id": "j9", "started": True, "finished": False}
    for second in (5, 10, 15):
        clock(second)
        # Ansible polls through a task of its own making, a new one each time.
        poll = task("", "ansible.builtin.async_status", jid="j9")
        callback.v2_runner_on_async_poll(result(poll, running))
    callback.v2_runner_on_async_ok(result(poll, {**running, "finished": True}))
    assert lines == [
        "TASK [Compile]",
        "[gpu-1] still waiting: 5 s (at most 600 s)",
        "[gpu-1] still waiting: 10 s (at most 600 s)",
    ]


def test_a_wait_line_says_the_progress_its_result_gives(screen, clock):
    callback, lines = screen
    wait = task("Wait for the health check", "dflash_wait", jid="j2")
    callback.v2_runner_on_start(Host("gpu-1"), wait)
    clock(7)
    data = {"ansible_job_id": "j2", "started": True, "finished": False, "retries": 3,
            "attempts": 1, "progress": "step 3 of 5"}  # fmt: skip
    callback.v2_runner_retry(result(wait, data, delay=5))
    assert lines[1:] == ["[gpu-1] still waiting: 7 s (at most 10 s), step 3 of 5"]


def test_a_plain_retry_counts_from_its_task_and_its_retries(screen, clock):
    callback, lines = screen
    poll = task("Wait for the lock", "ansible.builtin.stat", path="/x")
    callback.v2_runner_on_start(Host("gpu-1"), poll)
    clock(2)
    callback.v2_runner_retry(result(poll, {"retries": 11, "attempts": 1}, delay=3))
    assert lines[1:] == ["[gpu-1] still waiting: 2 s (at most 30 s)"]


def test_with_vv_a_retry_is_the_default_line(screen):
    callback, lines = screen
    callback._display.verbosity = 2
    poll = task("Wait", "ansible.builtin.stat", path="/x")
    callback.v2_runner_retry(result(poll, {"retries": 3, "attempts": 1}, delay=1))
    assert lines[0].startswith("FAILED - RETRYING: [gpu-1]: Wait (2 retries left)")


def test_ok_results_show_when_they_say_something(screen):
    callback, lines = screen
    quiet = task("Read the state", "ansible.builtin.stat", path="/x")
    callback.v2_runner_on_ok(result(quiet, {"changed": False}))
    assert lines == []
    said = task("Say what changes", "ansible.builtin.debug", msg="x")
    # (debug's results carry _ansible_verbose_always: their message shows without -v)
    message = {"changed": False, "msg": "Nothing to change", "_ansible_verbose_always": True}
    callback.v2_runner_on_ok(result(said, message))
    warned = task("Warn", "ansible.builtin.stat", path="/x")
    callback.v2_runner_on_ok(result(warned, {"changed": False, "warnings": ["mind the gap"]}))
    changed = task("Render run.sh", "ansible.builtin.copy", dest="/x")
    callback.v2_runner_on_ok(result(changed, {"changed": True}))
    text = "\n".join(lines)
    assert "Read the state" not in text
    assert "TASK [Say what changes]" in text and "msg: Nothing to change" in text
    assert "TASK [Warn]" in text and "TASK [Render run.sh]" in text
    assert "changed: [gpu-1]" in text
    # The option the default callback reads is back as configured after each result.
    assert callback.get_option("display_ok_hosts") is False


def test_a_failure_is_printed_once_with_its_place_and_stderr(screen):
    callback, lines = screen
    failed = task("Export", "ansible.builtin.command", cmd="false")
    data = {"failed": True, "msg": "non-zero return code", "rc": 1,
            "stderr": "Traceback ...\nValueError: bad step", "exception": "summary"}  # fmt: skip
    callback.v2_runner_on_failed(result(failed, data), ignore_errors=True)
    assert lines == [
        "TASK [Export]",
        "fatal: [gpu-1]: non-zero return code",
        "  stderr:",
        "    Traceback ...",
        "    ValueError: bad step",
        "...ignoring",
    ]


def test_ansible_doc_renders_it() -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    proc = subprocess.run([str(ANSIBLE_DOC), "-t", "callback", "dflash"], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0 and "progress_interval" in proc.stdout, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
