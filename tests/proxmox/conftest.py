"""Fixtures of the Proxmox tests: the session's test bed, reset before each test; the CPU
lock and its env seeded in the containers; playbooks run against every container."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from proxmoxer import ProxmoxAPI

from tests.helpers import PlaybookRun, run_playbook
from tests.testbed.bed import API_TOKEN, API_USER, Testbed

# Importing the fixture registers it here (pytest_plugins is allowed only in the top conftest).
from tests.testbed.pytest_plugin import proxmox_testbed  # noqa: F401


@pytest.fixture
def bed(proxmox_testbed: Testbed) -> Iterator[Testbed]:  # noqa: F811 - the fixture, by name
    """The session's bed with every container at its default config and running."""
    proxmox_testbed.reset()
    yield proxmox_testbed


@contextmanager
def newer_debian(bed: Testbed, vmid: int) -> Iterator[None]:
    """The container says it is Debian 15, newer than pve-container has tested: its start task
    ends `WARNINGS: 1` (LXC/Setup/Debian.pm). Put back afterwards: reset() keeps files."""
    original = bed.attach(vmid, "cat", "/etc/debian_version").stdout
    bed.attach(vmid, "sh", "-c", "echo 15.0 > /etc/debian_version")
    try:
        yield
    finally:
        bed.start_container(vmid)
        bed.attach(vmid, "sh", "-c", f"printf %s {shlex.quote(original)} > /etc/debian_version")


def https_api(bed: Testbed, token: str = API_TOKEN) -> ProxmoxAPI:
    """proxmoxer over the bed's HTTPS API with one of its tokens, trusting the bed's CA."""
    api = ProxmoxAPI(bed.host, port=bed.api_port, user=API_USER, token_name=token,
                     token_value=bed.token_secret(token), verify_ssl=str(bed.ca_file),
                     timeout=10)  # fmt: skip
    return api


@pytest.fixture
def api(bed: Testbed) -> ProxmoxAPI:
    """The bed's API as the inventory's privilege-separated token `dflash@pve!deploy`."""
    return https_api(bed)


SEED_ROOT = "/opt/dflash-seed"


@pytest.fixture(scope="session")
def bed_lock(proxmox_testbed: Testbed, local_wheelhouse: Path, local_lock: dict) -> dict:  # noqa: F811
    """The local CPU lock, installed from the node's wheelhouse mounted into the containers."""
    for wheel in local_wheelhouse.glob("*.whl"):
        if not (proxmox_testbed.wheelhouse / wheel.name).exists():
            shutil.copy(wheel, proxmox_testbed.wheelhouse)
    return dict(local_lock, source={"wheelhouse": proxmox_testbed.wheelhouse_ct})


@pytest.fixture(scope="session")
def bed_envs(proxmox_testbed: Testbed, bed_lock: dict, tmp_path_factory) -> str:  # noqa: F811
    """The torch env built once in every container by a real deploy (about a minute)."""
    inventory = proxmox_testbed.inventory(
        tmp_path_factory.mktemp("seed") / "inventory.yml",
        group_vars={"dflash_env_lock": bed_lock, "dflash_root": SEED_ROOT},
    )
    run = run_playbook("deploy.yml", {"dflash_launch": False}, inventory=inventory)
    assert run.rc == 0, run.output
    return f"{SEED_ROOT}/envs"


@pytest.fixture
def pct_playbook(
    bed: Testbed, bed_lock: dict, bed_envs: str, tmp_path: Path, request
) -> Callable[..., PlaybookRun]:
    """Run a playbook against every container with a fresh state root for this test."""
    root = f"/opt/dflash-{request.node.name[:40].replace('[', '-').replace(']', '')}"
    for vmid in bed.vmids:
        bed.attach(vmid, "rm", "-rf", root)
        bed.attach(vmid, "mkdir", "-p", root)
        seeded = bed.attach(vmid, "cp", "-al", bed_envs, f"{root}/envs", check=False)
        assert seeded.returncode == 0, seeded.stderr
    report = tmp_path / "verify.json"

    def inventory(host_vars: dict | None = None) -> Path:
        # tokens/s on a shared CI machine is noise: verify's throughput check (and the
        # deployed-state suite's) is off unless a test turns it on with -e.
        return bed.inventory(
            tmp_path / "inventory.yml",
            group_vars={
                "dflash_env_lock": bed_lock,
                "dflash_root": root,
                "dflash_verify_min_throughput_ratio": 0,
                # A trainer beside the suite's workers waits for a CPU by design.
                "dflash_verify_max_cpu_wait": 1,
            },
            host_vars=host_vars,
        )

    def run(name: str, host_vars: dict | None = None, **extravars: object) -> PlaybookRun:
        inventory(host_vars)
        extravars.setdefault("dflash_verify_json", str(report))
        # Most tests here deploy small fake packages: no trainer unless a test asks for one.
        extravars.setdefault("dflash_launch", False)
        # tokens/s on a shared CI machine is noise; the health-gate test turns the gate on.
        extravars.setdefault("dflash_min_throughput_ratio", 0)
        report.unlink(missing_ok=True)
        result = run_playbook(name, extravars, inventory=tmp_path / "inventory.yml")
        result.report = json.loads(report.read_text()) if report.exists() else None
        return result

    run.root = root  # type: ignore[attr-defined]
    run.inventory = inventory  # type: ignore[attr-defined]
    return run
