# The controller side of the deploy lock: who this run is (its ansible-playbook process), and
# what to do when another run holds the lock: wait a bounded time, take over the lock of a
# holder that is dead or silent too long (and say so), or fail naming the holder.
from __future__ import annotations

import getpass
import os
import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    describe,
    holder_alive,
    kernel_identity,
    start_ticks,
    token_of,
    utc_now,
)

DOCUMENTATION = r"""
---
module: dflash_deploy_lock
short_description: Hold the deploy lock of a state root for the whole play
description:
  - The controller side of M(dflash_deploy_lock). Names this run by its ansible-playbook
    process (user, host, pid and start time, kernel and pid namespace) and takes the target's
    lock for it.
  - When another run holds the lock, waits up to I(wait) seconds for it; takes it over, with a
    warning naming the old holder and the phase it was in, when that holder is dead (its
    process is gone, where this controller can see it) or has not renewed the lock for
    I(stale_after) seconds, or when I(break_lock) is set; otherwise fails naming the holder.
options:
  root:
    description: State root on the target.
    type: path
    required: true
  state:
    description: C(acquired) or C(released).
    type: str
    choices: [acquired, released]
    default: acquired
  action:
    description: What this run does (deploy, rollback, stop).
    type: str
    default: deploy
  release:
    description: The release this run deploys, when known.
    type: str
  wait:
    description: Seconds to wait for a lock held by a live run (0 fails at once).
    type: int
    default: 0
  stale_after:
    description: Seconds without renewal after which another controller's lock counts as dead.
    type: int
    default: 1800
  break_lock:
    description: Take the lock whoever holds it (only when you know that run is gone).
    type: bool
    default: false
  expect_generation:
    description:
      - The lock's generation that a read of this run saw while the lock was free (M(dflash_facts)
        C(deploy_lock_generation)); the result's C(unchanged_since_read) says whether no other
        run took the lock since, so that the read still holds and need not be repeated.
    type: int
author: dflash-deploy
"""

POLL_S = 2.0


def _cmdline_and_parent(pid: int) -> tuple[bytes, int] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ")
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            parent = int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None
    return cmdline, parent


def playbook_process() -> int:
    """The ansible-playbook process this task runs under: the lock's holder. Task workers are
    forks of it with its command line, so it is the topmost of the ancestors, this process
    included, that run ansible (`ansible-playbook ...` or `python -m ansible playbook ...`)."""
    pid, found = os.getpid(), None
    for _ in range(32):
        seen = _cmdline_and_parent(pid)
        if seen is None or b"ansible" not in seen[0]:
            break
        found, pid = pid, seen[1]
        if pid <= 1:
            break
    return found or os.getppid()


def controller_holder() -> dict[str, Any]:
    pid = playbook_process()
    return {
        "user": getpass.getuser(),
        "host": os.uname().nodename,
        "pid": pid,
        "pid_start": start_ticks(pid),
        **kernel_identity(),
    }


def stale_reason(held: dict, stale_after: int, break_lock: bool) -> str | None:
    """Why another run's lock may be replaced, or None while it must be respected."""
    holder = held.get("holder") or {}
    if held.get("torn"):
        return "its lock file was cut short"
    if break_lock:
        return "dflash_deploy_lock_break is set"
    if holder_alive(holder) is False:
        return f"its process (pid {holder.get('pid')}) is gone"
    age = held.get("age_s")
    if holder_alive(holder) is None and age is not None and age > stale_after:
        return (
            f"it has not renewed the lock for {age:g} s "
            f"(dflash_deploy_lock_stale_after={stale_after})"
        )
    return None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("root", "state", "action", "release", "wait", "stale_after",
                             "break_lock", "expect_generation"))  # fmt: skip

    def _lock_module(self, task_vars: dict, **args: Any) -> dict:
        result = self._execute_module(
            module_name="dflash_deploy_lock", module_args=args, task_vars=task_vars
        )
        if result.get("failed"):
            raise AnsibleActionFail(result.get("msg", "the deploy lock module failed"))
        return result

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        root, state = args["root"], args.get("state", "acquired")
        holder = controller_holder()
        token = token_of(holder)
        result.update(changed=False, token=token, holder=holder)
        if state == "released":
            if not self._task.check_mode:
                got = self._lock_module(task_vars, root=root, state="released", token=token)
                result["released"] = got["released"]
            return result
        if self._task.check_mode:
            # Check mode takes no lock; it says when a real run would have to wait.
            lock = self._lock_module(task_vars, root=root, state="status")["lock"]
            if lock and lock.get("token") != token:
                result["warnings"] = [f"{root} is locked by {describe(lock)}"]
            # Nothing is taken or changed: a read made with the lock free is as good as a new one.
            result["unchanged_since_read"] = args.get("expect_generation") is not None
            return result
        wait = int(args.get("wait", 0))
        stale_after = int(args.get("stale_after", 1800))
        break_lock = bool(args.get("break_lock", False))
        deadline = time.monotonic() + wait
        take_over = None
        while True:
            got = self._lock_module(
                task_vars, root=root, state="acquired", token=token, holder=holder,
                action=args.get("action", "deploy"), release=args.get("release"),
                take_over=take_over, expect_generation=args.get("expect_generation"),
            )  # fmt: skip
            if got["acquired"]:
                break
            held = got["held_by"]
            reason = stale_reason(held, stale_after, break_lock)
            if reason and take_over != held.get("token"):
                take_over = held.get("token")
                continue
            if time.monotonic() >= deadline:
                raise AnsibleActionFail(
                    f"{root} on {task_vars.get('inventory_hostname')} is locked by "
                    f"{describe(held)} (renewed {held.get('age_s')} s ago). Wait for it to end "
                    "and run again, or wait for it with -e dflash_deploy_lock_wait=SECONDS; if "
                    "that run is gone for sure, -e dflash_deploy_lock_break=true takes the lock"
                )
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        previous = got.get("taken_over")
        if previous:
            result["taken_over"] = previous
            why = stale_reason(previous, stale_after, break_lock) or "it was replaced"
            result["warnings"] = [
                f"took over the deploy lock of {root} from {describe(previous)}: {why}. "
                "What that run left is finished or named by this one"
            ]
        result["lock"] = got["lock"]
        result["unchanged_since_read"] = bool(got.get("unchanged_since_read"))
        result["cleaned"] = got.get("cleaned") or []
        result["acquired_at"] = utc_now()
        return result
