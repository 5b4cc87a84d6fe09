"""community.proxmox over the bed's HTTPS API: the dynamic inventory plugin finds the tagged
containers with inventory/dflash.example.proxmox.yml as it is; proxmox_vm_info reads the same
current and pending config the dflash_proxmox check does; the token secret is never shown."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from proxmoxer import ProxmoxAPI

from tests.testbed.bed import Testbed

from .ansible_run import CA_ENV, PROXMOX_API_ARGS, REPO, run_playbook

pytestmark = pytest.mark.testbed

BIN = Path(sys.executable).parent


def plugin_env(bed: Testbed) -> dict[str, str]:
    """What the example inventory reads from the environment, pointed at the bed."""
    return {"PROXMOX_URL": bed.api_url, "PROXMOX_TOKEN_SECRET": bed.token_secret(),
            "REQUESTS_CA_BUNDLE": str(bed.ca_file)}  # fmt: skip


def plain(value: object) -> object:
    """ansible-inventory --list marks what the plugin read as unsafe: {"__ansible_unsafe": v}."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def dynamic_inventory(bed: Testbed, tmp_path: Path) -> dict:
    """`ansible-inventory --list` of inventory/dflash.example.proxmox.yml, as it is, on the bed."""
    source = tmp_path / "cluster.proxmox.yml"  # the plugin reads only *.proxmox.yml
    shutil.copy(REPO / "inventory/dflash.example.proxmox.yml", source)
    env = {**os.environ, **plugin_env(bed), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    command = [str(BIN / "ansible-inventory"), "-i", str(source), "--list"]
    listed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    return plain(json.loads(listed.stdout))  # type: ignore[return-value]


def test_dynamic_inventory_finds_the_tagged_containers(
    bed: Testbed, tmp_path: Path, api: ProxmoxAPI
) -> None:
    tagged, untagged = bed.vmids
    api.nodes(bed.node).lxc(tagged).config.put(tags="dflash;gpu")  # tags apply at once
    api.nodes(bed.node).lxc(untagged).config.put(tags="other")
    api.nodes(bed.node).lxc(tagged).config.put(dev0="/dev/null")  # pending while it runs
    found = dynamic_inventory(bed, tmp_path)
    source = tmp_path / "cluster.proxmox.yml"
    host = bed.hostname(tagged)
    assert found["dflash_targets"]["hosts"] == [host]
    facts = found["_meta"]["hostvars"]
    assert set(facts) == {host}
    assert (facts[host]["proxmox_vmid"], facts[host]["proxmox_node"]) == (tagged, bed.node)
    assert facts[host]["ansible_connection"] == "dflash_pct"
    assert facts[host]["proxmox_tags_parsed"] == ["dflash", "gpu"]
    # Through it, for real: pct over SSH to the container, and community.proxmox's
    # proxmox_vm_info, whose current and pending configs differ by the pending dev0. The bed's
    # node name does not resolve, so its address comes in as an extra var.
    info = {"community.proxmox.proxmox_vm_info": {
        **{k: v for k, v in PROXMOX_API_ARGS.items() if k != "node"}, "validate_certs": True,
        "type": "lxc", "config": "{{ item }}"},
        "loop": ["current", "pending"], "environment": CA_ENV, "delegate_to": "localhost",
        "register": "info", "name": "info"}  # fmt: skip
    plays = [{"hosts": "dflash_targets", "gather_facts": False, "tasks": [
        {"name": "ping", "ansible.builtin.ping": {}}, info]}]  # fmt: skip
    connection = bed.inventory(tmp_path / "vars.yml", vmids=[])  # the group's SSH and API vars
    run = run_playbook(plays, [source, connection], tmp_path, env=plugin_env(bed),
                       extravars={"ansible_host": bed.host})  # fmt: skip
    assert run.rc == 0, run.output
    assert run.results("ping")[host]["ping"] == "pong"
    current, pending = (r["proxmox_vms"][0]["config"] for r in run.results("info")[host]["results"])
    assert "dev0" not in current and pending["dev0"] == "/dev/null"


def test_the_token_secret_is_never_shown(bed: Testbed, tmp_path: Path, bed_lock: dict) -> None:
    inventory = bed.inventory(tmp_path / "inventory.yml", group_vars={"dflash_env_lock": bed_lock})
    playbook = tmp_path / "check.yml"
    playbook.write_text(json.dumps([{"hosts": "all", "gather_facts": False,
                                     "roles": ["dflash", "dflash_proxmox"]}]))  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([str(BIN / "ansible-playbook"), "-vvv", "-i", str(inventory),
                           str(playbook)], env=env, capture_output=True, text=True, timeout=300,
                          check=False, cwd=REPO)  # fmt: skip
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-3000:]
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in shown  # the argument was there, masked
    assert bed.token_secret() not in shown
