# The project's screen output: Ansible's default callback, with waits shown as progress and
# each failure printed once. ansible.cfg sets it as stdout_callback; an ANSIBLE_STDOUT_CALLBACK
# of the user's (or ansible-runner's awx_display) replaces it and keeps working as before.
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ansible import constants as C
from ansible.executor.task_result import CallbackTaskResult
from ansible.playbook.task import Task
from ansible.playbook.task_include import TaskInclude
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = r"""
---
name: dflash
type: stdout
short_description: Ansible's default output, with waits as progress lines and errors once
description:
  - Ansible's default screen output (C(ansible.builtin.default)), with four changes, so that a
    long deploy reads as progress and a no-op one fits on a screen.
  - A task that retries (C(until) with C(retries); the waits of the env build and the health
    check) prints a progress line instead of C(FAILED - RETRYING) - the host, the seconds since
    its job (or the task) started, the most it will wait and the C(progress) its result gives
    (the health wait's C(step 3 of 5), from action_plugins/dflash_wait.py) - at its first
    retry, then each time it has lasted twice as long, at most every O(progress_interval)
    seconds. A task polled by Ansible itself (C(async) with C(poll) above 0; the compile cache
    warm-up) prints the same line instead of C(ASYNC POLL), and no C(ASYNC OK) line.
  - O(display_ok_hosts) and O(display_skipped_hosts) are off by default (a no-op deploy fits
    on a screen), and an C(ok) result that says something, a C(debug) message, a warning or
    the notes of C(dflash_check) (action_plugins/dflash_check.py), is shown all the same (the
    default hides those warnings with the result); C(included) lines are hidden with the other
    C(ok) results.
  - "A failed task is printed once, as C(fatal: [host]: <its message>), then where the task is
    (C(file:line)) and the C(stderr) it left, if any. The default prints a failure twice, an
    error summary with a source excerpt and then the whole result. With
    C(ANSIBLE_DISPLAY_TRACEBACK=error) the summary, with its traceback, is shown too."
  - With C(-vv) or more, retries and failures are printed as the default prints them, and every
    C(ok) result is shown (with C(-vvv), the module arguments it ran with).
extends_documentation_fragment:
  - default_callback
  - result_format_callback
options:
  # The default callback's two options, with this callback's defaults and its own ini section:
  # ansible.cfg's [defaults] leaves them alone, so another stdout callback a user or
  # ansible-runner sets prints as it always does.
  display_ok_hosts:
    name: Show 'ok' hosts
    description:
      - Show the C(ok) results that say nothing (those that do always show).
    type: bool
    default: false
    env:
      - name: ANSIBLE_DISPLAY_OK_HOSTS
    ini:
      - key: display_ok_hosts
        section: dflash_callback
  display_skipped_hosts:
    name: Show skipped hosts
    description:
      - Show skipped tasks.
    type: bool
    default: false
    env:
      - name: ANSIBLE_DISPLAY_SKIPPED_HOSTS
    ini:
      - key: display_skipped_hosts
        section: dflash_callback
  progress_interval:
    description:
      - Seconds between two progress lines of one waiting task; the first comes at its first
        retry or poll.
    type: int
    default: 30
    env:
      - name: DFLASH_PROGRESS_INTERVAL
    ini:
      - key: progress_interval
        section: dflash_callback
requirements:
  - set as C(stdout_callback) in ansible.cfg (with C(callback_plugins) naming this folder)
author: dflash-deploy
"""


def wait_line(host: str, elapsed_s: float, limit_s: float | None, progress: str | None) -> str:
    """`[gpu-1] still waiting: 35 s (at most 300 s), step 3 of 5`."""
    limit = f" (at most {limit_s:.0f} s)" if limit_s else ""
    return f"[{host}] still waiting: {elapsed_s:.0f} s{limit}" + (
        f", {progress}" if progress else ""
    )


def due(elapsed_s: float, shown_at_s: float | None, interval_s: float) -> bool:
    """Whether a wait that has lasted `elapsed_s` shows another progress line, its last one at
    `shown_at_s`: at its first retry, then each time it has lasted twice as long (a short wait
    gets a few lines), at most every `interval_s`."""
    return shown_at_s is None or elapsed_s - shown_at_s >= min(interval_s, max(shown_at_s, 1.0))


def failure_lines(result: dict[str, Any], place: str | None) -> list[str]:
    """A failed result as its message, then where the task is and what it left on stderr."""
    lines = [str(result.get("msg") or "failed, without a message").strip()]
    if place:
        lines.append(f"  task: {place}")
    for key in ("stderr", "module_stderr"):
        text = str(result.get(key) or "").strip()
        # A message that quotes its command's stderr (the roles' fail tasks do) says it already.
        if text and text not in lines[0]:
            tail = text.splitlines()[-20:]
            lines.append(f"  {key}:")
            lines.extend(f"    {line}" for line in tail)
    return lines


def task_place(task: Task) -> str | None:
    """The task's file:line, relative to the working directory when it lies below it."""
    path = task.get_path()
    if not path:
        return None
    relative = os.path.relpath(path, os.getcwd())
    return path if relative.startswith("..") else relative


def seconds(value: object) -> float | None:
    """A task's async or poll value as a number; None while it is still a template."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "dflash"

    def __init__(self) -> None:
        super().__init__()
        # When each host's task and each async job began (monotonic s): a wait's elapsed time
        # counts from its job's start, not from the task that polls it.
        self._started: dict[tuple[str, str], float] = {}
        self._jobs: dict[str, tuple[float, float | None]] = {}
        # The task each host runs now: an async poll's result names a task of Ansible's making.
        self._running: dict[str, Task] = {}
        # How long each (host, task) had waited at its last progress line.
        self._shown: dict[tuple[str, str], float] = {}

    def v2_runner_on_start(self, host: Any, task: Task) -> None:
        self._started[(host.get_name(), task._uuid)] = time.monotonic()
        self._running[host.get_name()] = task
        super().v2_runner_on_start(host, task)

    def v2_runner_retry(self, result: CallbackTaskResult) -> None:
        if self._display.verbosity >= 2:
            super().v2_runner_retry(result)
            return
        delay = float(result.task_fields.get("delay") or 0)
        limit = max(int(result.result.get("retries", 0)) - 1, 0) * delay or None
        self._progress(result, result.task, limit)

    def v2_runner_on_async_poll(self, result: CallbackTaskResult) -> None:
        if self._display.verbosity >= 2:
            super().v2_runner_on_async_poll(result)
            return
        # The poll is a task of Ansible's making (async_status); the host's task is the one.
        task = self._running.get(result.host.get_name(), result.task)
        limit, poll = seconds(task.async_val), seconds(task.poll) or 0
        # Each item of a loop is a job of its own, first polled `poll` seconds after it began.
        began = time.monotonic() - poll
        self._jobs.setdefault(str(result.result.get("ansible_job_id")), (began, limit))
        self._progress(result, task, limit)

    def _progress(self, result: CallbackTaskResult, task: Task, limit_s: float | None) -> None:
        now = time.monotonic()
        key = (result.host.get_name(), task._uuid)
        started = self._started.get(key, now)
        job = self._jobs.get(str(result.result.get("ansible_job_id")))
        if job:
            started, limit_s = job[0], job[1] or limit_s
        if not due(now - started, self._shown.get(key), self.get_option("progress_interval")):
            return
        self._shown[key] = now - started
        if self._last_task_banner != task._uuid:
            self._print_task_banner(task)
        # What the job has got to, where its wait task reads it (action_plugins/dflash_wait.py).
        progress = result.result.get("progress")
        line = wait_line(self.host_label(result), now - started, limit_s, progress)
        self._display.display(line, color=C.COLOR_VERBOSE)

    def v2_runner_on_async_ok(self, result: CallbackTaskResult) -> None:
        # The job's result line follows: `ASYNC OK on <host>: jid=...` says nothing more.
        if self._display.verbosity >= 2:
            super().v2_runner_on_async_ok(result)

    def v2_runner_on_async_failed(self, result: CallbackTaskResult) -> None:
        if self._display.verbosity >= 2:
            super().v2_runner_on_async_failed(result)

    def v2_runner_on_ok(self, result: CallbackTaskResult) -> None:
        raw = result.result
        if raw.get("ansible_job_id") and raw.get("started") and not raw.get("finished"):
            # A job started in the background (poll: 0): its wait task polls it next.
            key = (result.host.get_name(), result.task._uuid)
            limit = result.task_fields.get("async_val")
            self._jobs[str(raw["ansible_job_id"])] = (
                self._started.get(key, time.monotonic()), float(limit) if limit else None
            )  # fmt: skip
        says = result.task.action in C._ACTION_DEBUG or bool(raw.get("warnings"))
        # A result marked to be shown without -v (dflash_check's notes) says something too.
        says = says or bool(raw.get("_ansible_verbose_always"))
        if isinstance(result.task, TaskInclude) and not self._ok_shown():
            return
        with self._option("display_ok_hosts", self._ok_shown() or says):
            super().v2_runner_on_ok(result)

    def v2_runner_item_on_ok(self, result: CallbackTaskResult) -> None:
        says = result.task.action in C._ACTION_DEBUG or bool(result.result.get("warnings"))
        with self._option("display_ok_hosts", self._ok_shown() or says):
            super().v2_runner_item_on_ok(result)

    def _ok_shown(self) -> bool:
        """Every ok result shows when asked for, or with -vv and more (a user debugging)."""
        return bool(self.get_option("display_ok_hosts")) or self._display.verbosity >= 2

    def v2_playbook_on_include(self, included_file: Any) -> None:
        if self.get_option("display_ok_hosts") or self._display.verbosity:
            super().v2_playbook_on_include(included_file)

    def v2_runner_on_failed(self, result: CallbackTaskResult, ignore_errors: bool = False) -> None:
        if self._display.verbosity >= 2 or (result.task.loop and "results" in result.result):
            super().v2_runner_on_failed(result, ignore_errors)
            return
        self._show_failure(result, f"fatal: [{self.host_label(result)}]: ")
        if ignore_errors:
            self._display.display("...ignoring", color=C.COLOR_SKIP)

    def v2_runner_item_on_failed(self, result: CallbackTaskResult) -> None:
        if self._display.verbosity >= 2:
            super().v2_runner_item_on_failed(result)
            return
        label = self._get_item_label(result.result)
        self._show_failure(result, f"failed: [{self.host_label(result)}] (item={label}): ")

    def _show_failure(self, result: CallbackTaskResult, prefix: str) -> None:
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        # The error summary repeats the message with a source excerpt: shown only when it
        # carries the traceback a user asked for (ANSIBLE_DISPLAY_TRACEBACK=error).
        summary = self._current_task_result and self._current_task_result.exception
        if not (summary and summary.event.formatted_traceback):
            result.result.pop("exception", None)
        self._handle_warnings_and_exception(result)
        first, *rest = failure_lines(result.result, task_place(result.task))
        stderr = self.get_option("display_failed_stderr")
        self._display.display(prefix + first, color=C.COLOR_ERROR, stderr=stderr)
        for line in rest:
            self._display.display(line, color=C.COLOR_ERROR, stderr=stderr)

    @contextmanager
    def _option(self, name: str, value: object) -> Iterator[None]:
        """The default callback reads its options as it prints: set one for one result."""
        kept = self.get_option(name)
        self.set_option(name, value)
        try:
            yield
        finally:
            self.set_option(name, kept)
