"""The deployed state of every selected target, read through Ansible in one playbook run.

Testinfra's ansible backend costs one `ansible` process per command on connections it cannot
drive itself (proxmox_pct_remote: ~2 s each), so the suite asks each host once, with the
toolkit's own facts module, and asserts on that document."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(__file__).with_name("facts.yml")
# The ansible executables next to the interpreter running pytest (the project venv).
BIN = Path(sys.executable).parent
FACTS_TASK = "Read the live state in one call"
LIMITS_TASK = "Report the limits the suite asserts with"
DEFAULT_PATTERN = "dflash_targets"
# Bounds of the two ansible runs; a hung connection must not hang the suite.
LIST_TIMEOUT_S = 120
FACTS_TIMEOUT_S = 600
_LIST_HEADER = re.compile(r"^\s*hosts \(\d+\):\s*$")


class SelectionError(Exception):
    """The inventory or the host pattern cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Selection:
    inventory: Path
    pattern: str


@dataclass(frozen=True)
class Target:
    """One host's facts document, or why there is none."""

    name: str
    # Kept out of the repr: pytest prints fixtures' reprs in its tracebacks.
    facts: dict | None = field(default=None, repr=False)
    heartbeat_max_age: float | None = None
    min_throughput_ratio: float | None = None
    max_cpu_wait: float = 1.0
    contention_after: float = 0.0
    error: str | None = None


def ansible_env() -> dict[str, str]:
    """The repo's ansible.cfg (library/, roles/) and the venv's ansible first on PATH."""
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def list_hosts(selection: Selection) -> list[str]:
    """The inventory's hosts matching the pattern, without connecting to any of them."""
    cmd = [str(BIN / "ansible"), "-i", str(selection.inventory), selection.pattern, "--list-hosts"]
    try:
        proc = subprocess.run(
            cmd, env=ansible_env(), capture_output=True, text=True, timeout=LIST_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise SelectionError(f"`{' '.join(cmd)}` gave no answer within {err.timeout} s") from err
    if proc.returncode != 0:
        raise SelectionError(
            f"ansible could not read inventory {selection.inventory}:\n"
            f"{_tail(proc.stderr + proc.stdout)}"
        )
    hosts = [line.strip() for line in proc.stdout.splitlines() if not _LIST_HEADER.match(line)]
    hosts = [host for host in hosts if host]
    if not hosts:
        raise SelectionError(
            f"no host of inventory {selection.inventory} matches {selection.pattern!r}; "
            "pass the group or host names with --hosts (default: dflash_targets)"
        )
    return hosts


def _failed_everywhere(hosts: list[str], why: str) -> dict[str, Target]:
    return {host: Target(host, error=why) for host in hosts}


def read_targets(selection: Selection, hosts: list[str]) -> dict[str, Target]:
    """Run facts.yml once against the selection; one Target per listed host, read or not."""
    env = ansible_env()
    # Machine-readable results of every task of every host, alone on stdout.
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    for name in ("ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_WHITELIST"):
        env.pop(name, None)
    cmd = [
        str(BIN / "ansible-playbook"), "-i", str(selection.inventory), str(PLAYBOOK),
        "-e", json.dumps({"dflash_hosts": selection.pattern}),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=FACTS_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return _failed_everywhere(
            hosts, f"the facts playbook gave no answer within {FACTS_TIMEOUT_S} s"
        )
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return _failed_everywhere(
            hosts,
            f"ansible-playbook failed (rc {proc.returncode}):\n{_tail(proc.stderr or proc.stdout)}",
        )
    results: dict[str, dict[str, dict]] = {}
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            for host, result in task.get("hosts", {}).items():
                results.setdefault(host, {})[task["task"]["name"]] = result
    return {host: _target(host, results.get(host, {}), proc.returncode) for host in hosts}


def _target(host: str, results: dict[str, dict], rc: int) -> Target:
    facts = results.get(FACTS_TASK)
    if facts is None:
        return Target(host, error=f"ansible-playbook returned no result for it (rc {rc})")
    if facts.get("unreachable"):
        return Target(host, error=f"unreachable: {facts.get('msg')}")
    if facts.get("failed"):
        return Target(host, error=f"dflash_facts failed: {facts.get('msg')}")
    limits = results[LIMITS_TASK]["msg"]
    return Target(
        host,
        facts=facts,
        heartbeat_max_age=float(limits["heartbeat_max_age"]),
        min_throughput_ratio=float(limits["min_throughput_ratio"]),
        max_cpu_wait=float(limits["max_cpu_wait"]),
        contention_after=float(limits["contention_after"]),
    )
