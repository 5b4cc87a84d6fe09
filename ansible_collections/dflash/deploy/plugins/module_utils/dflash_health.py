# The launch's health check (docs/deploy.md, launch): the trainer's status.json must show
# steps of this run with the deployed code, then its tokens/s must pass the throughput gate.
from __future__ import annotations

import time
from collections.abc import Callable

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import read_json
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import WAIT_NOISE

LOG_TAIL_LINES = 40


class LaunchError(Exception):
    """A failed launch; `details` (run id, status, tokens/s) go back with the message."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


def log_tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-LOG_TAIL_LINES:])
    except OSError:
        return "(no log)"


def ended(code: int | str | None, status: dict) -> str:
    """How a trainer ended, in words: its exit code or signal, and what status.json said."""
    if code is None:
        how = "status.json says failed while its process still ran"
    elif isinstance(code, int) and code < 0:
        how = f"killed by signal {-code}"
    elif isinstance(code, int):
        how = f"exited with code {code}"
    else:
        how = code
    state = status.get("state")
    said = f"status.json: state {state}" if state else "no status.json written"
    error = status.get("error")
    return f"{how}; {said}" + (f", error: {error}" if error else "")


def wait_healthy(
    exit_code: Callable[[], int | str | None], status_path: str, log_path: str, tree: str,
    timeout: int, steps: int, check: Callable[[], None] = lambda: None,
) -> dict:  # fmt: skip
    """status.json once it says `running` after `steps` steps of this run with code `tree`.

    `exit_code()` is None while the trainer lives, else its exit code (or, for a trainer this
    process did not start, why it is gone); `check()` raises to abandon the wait (the play
    that asked for it is gone)."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        check()
        status = read_json(status_path) or status
        code = exit_code()
        if code is None and state_is(status, "failed"):
            # The supervisor lives on to restart it; it wrote how the trainer ended.
            code = status.get("exit_code")
        if state_is(status, "failed") or code is not None:
            raise LaunchError(
                f"the trainer failed at start ({ended(code, status)}); last lines of "
                f"{log_path}:\n{log_tail(log_path)}"
            )
        # Steps of this run: a trainer that resumed a checkpoint starts from its step.
        done = (status.get("step") or 0) - (status.get("resumed_from_step") or 0)
        if state_is(status, "stepping") and done >= steps:
            if status.get("code_tree_sha256") != tree:
                raise LaunchError(
                    f"the trainer runs code tree {status.get('code_tree_sha256')}, but current "
                    f"is {tree}: it did not import the deployed release; see {log_path}"
                )
            return status
        time.sleep(0.2)
    raise LaunchError(
        f"fewer than {steps} training steps within {timeout} s (state "
        f"{status.get('state') or 'no status.json yet'}, step {status.get('step', 0)}); raise "
        f"dflash_health_timeout or read the log. Last lines of {log_path}:\n{log_tail(log_path)}"
    )


def speed_text(status: dict) -> str:
    """A healthy status's tokens/s as measured, and, on a busy host, the figure with the
    trainer's wait for a CPU left out: the one verify and later gates compare with."""
    measured = float(status.get("tokens_per_s") or 0.0)
    unstarved = status.get("unstarved_tokens_per_s")
    if unstarved and measured < WAIT_NOISE * unstarved:
        return (
            f"{measured:.1f} tokens/s ({float(unstarved):.1f} with its wait for a CPU left "
            "out: a busy host)"
        )
    return f"{measured:.1f} tokens/s"


def throughput_problem(
    params: dict, tokens_per_s: float, unstarved: float | None = None
) -> str | None:
    """Why a healthy-looking trainer is still too slow to keep, or None. The floor is on the
    tokens/s as measured; the comparison with earlier deployments on the figure with the
    trainer's wait for a CPU left out (`unstarved`, where the trainer gives it): a busy host
    is not a slower release."""
    floor = params["min_tokens_per_s"]
    if floor and tokens_per_s < floor:
        return (
            f"throughput gate: {tokens_per_s:.1f} tokens/s is under the floor of {floor:g} "
            "(dflash_min_tokens_per_s)"
        )
    ratio, baseline = params["min_throughput_ratio"], params["baseline_tokens_per_s"]
    judged = unstarved or tokens_per_s
    if ratio and baseline and judged < ratio * baseline:
        measured = (
            f" with its wait for a CPU left out ({tokens_per_s:.1f} as measured)"
            if tokens_per_s < WAIT_NOISE * judged
            else ""
        )
        return (
            f"throughput gate: {judged:.1f} tokens/s{measured} is under {ratio:g} x "
            f"{baseline:.1f} "
            f"tokens/s of {params['baseline_name']} = {ratio * baseline:.1f} "
            "(dflash_min_throughput_ratio)"
        )
    return None


def job_problem(status: dict, job: dict) -> str | None:
    """Why a healthy-looking trainer of a job over several hosts is not in that job: another
    rendezvous, or fewer ranks than the job's hosts give (a node missing), else None."""
    if not job:
        return None
    seen = status.get("job") or {}
    if seen.get("rdzv_id") != job.get("rdzv_id"):
        return (
            f"the trainer is in rendezvous {seen.get('rdzv_id')!r}, not job {job.get('name')}'s "
            f"{job.get('rdzv_id')!r}"
        )
    if seen.get("world_size") != job.get("world_size"):
        return (
            f"the trainer's job has {seen.get('world_size')} ranks, job {job.get('name')} needs "
            f"{job.get('world_size')} (hosts {', '.join(job.get('hosts', []))})"
        )
    return None
