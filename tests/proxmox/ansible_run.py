"""Run real ansible-playbook against the test bed and read each host's task results (JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

# The modules' connection arguments, from the variables the bed's inventory sets (its HTTPS
# API, the privilege-separated token); the node's CA is trusted through REQUESTS_CA_BUNDLE.
PROXMOX_API_ARGS = {
    "api_host": "{{ proxmox_api_host }}",
    "api_port": "{{ proxmox_api_port }}",
    "api_user": "{{ proxmox_api_user }}",
    "api_token_id": "{{ proxmox_api_token_id }}",
    "api_token_secret": "{{ proxmox_api_token_secret }}",
    "node": "{{ proxmox_node }}",
    "vmid": "{{ proxmox_vmid }}",
}
CA_ENV = {"REQUESTS_CA_BUNDLE": "{{ proxmox_api_ca_file }}"}


@dataclass
class PlayRun:
    rc: int
    output: dict[str, Any]  # the ansible.posix.json callback's document
    stderr: str

    def results(self, task: str) -> dict[str, dict[str, Any]]:
        """host -> result of the task named `task` (the last one of that name)."""
        found: dict[str, dict[str, Any]] = {}
        for play in self.output.get("plays", []):
            for entry in play["tasks"]:
                if entry["task"]["name"] == task:
                    found.update(entry["hosts"])
        return found

    def stats(self, host: str) -> dict[str, int]:
        return self.output["stats"][host]


def run_playbook(
    plays: list[dict[str, Any]],
    inventory: Path | list[Path],
    workdir: Path,
    check: bool = False,
    env: dict[str, str] | None = None,
    extravars: dict[str, Any] | None = None,
) -> PlayRun:
    playbook = workdir / "playbook.yml"
    playbook.write_text(json.dumps(plays, indent=1))  # JSON is YAML
    environment = dict(os.environ)
    environment.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),  # the repo's settings, library/ included
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(workdir / "ansible-tmp"),
        **(env or {}),
    )
    sources = inventory if isinstance(inventory, list) else [inventory]
    cmd = [str(ANSIBLE_PLAYBOOK), *[arg for s in sources for arg in ("-i", str(s))], str(playbook)]
    if check:
        cmd.append("--check")
    if extravars:
        cmd += ["-e", json.dumps(extravars)]
    proc = subprocess.run(
        cmd, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300, check=False
    )
    try:
        output = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"no JSON from ansible-playbook (rc {proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}") from exc  # fmt: skip
    return PlayRun(proc.returncode, output, proc.stderr)


def module_play(args: dict[str, Any], module: str = "dflash_proxmox") -> dict[str, Any]:
    """A play running one of the Proxmox modules once per container, on the controller; the
    task is named after the module. Failures are kept for the test to read, not raised."""
    return {
        "name": f"{module} over the test bed",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [
            {
                "name": module,
                module: {**PROXMOX_API_ARGS, **args},
                "environment": CA_ENV,
                "delegate_to": "localhost",
                "ignore_errors": True,
            }
        ],
    }
