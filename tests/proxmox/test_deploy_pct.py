"""deploy.yml, verify.yml and rollback.yml unchanged against the test bed: two real LXC
containers reached through community.proxmox.proxmox_pct_remote; only the inventory differs."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import PlaybookRun, run_playbook
from tests.testbed.bed import Testbed

SEED_ROOT = "/opt/dflash-seed"
V1 = {"dflash/__init__.py": "VERSION = 1\n", "dflash/train.py": "print('one')\n"}
V2 = {"dflash/__init__.py": "VERSION = 2\n", "dflash/train.py": "print('two')\n"}


@pytest.fixture(scope="session")
def bed_lock(proxmox_testbed: Testbed, local_wheelhouse: Path, local_lock: dict) -> dict:
    """The local CPU lock, installed from the node's wheelhouse mounted into the containers."""
    for wheel in local_wheelhouse.glob("*.whl"):
        if not (proxmox_testbed.wheelhouse / wheel.name).exists():
            shutil.copy(wheel, proxmox_testbed.wheelhouse)
    return dict(local_lock, source={"wheelhouse": proxmox_testbed.wheelhouse_ct})


@pytest.fixture(scope="session")
def bed_envs(proxmox_testbed: Testbed, bed_lock: dict, tmp_path_factory) -> str:
    """The torch env built once in every container by a real deploy (about a minute)."""
    inventory = proxmox_testbed.inventory(
        tmp_path_factory.mktemp("seed") / "inventory.yml",
        group_vars={"dflash_lock": bed_lock, "dflash_root": SEED_ROOT},
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

    def run(name: str, host_vars: dict | None = None, **extravars: object) -> PlaybookRun:
        inventory = bed.inventory(
            tmp_path / "inventory.yml",
            group_vars={"dflash_lock": bed_lock, "dflash_root": root},
            host_vars=host_vars,
        )
        extravars.setdefault("dflash_verify_json", str(report))
        # Most tests here deploy small fake packages: no trainer unless a test asks for one.
        extravars.setdefault("dflash_launch", False)
        result = run_playbook(name, extravars, inventory=inventory)
        result.report = json.loads(report.read_text()) if report.exists() else None
        return result

    run.root = root  # type: ignore[attr-defined]
    return run


def current_in(bed: Testbed, vmid: int, root: str) -> str:
    return bed.attach(vmid, "readlink", f"{root}/current").stdout.strip()


def test_lifecycle_across_two_containers(bed, pct_playbook, source_repo):
    source_repo("v1", V1)
    repo = str(source_repo("v2", V2))
    root = pct_playbook.root
    hosts = [bed.hostname(v) for v in bed.vmids]

    first = pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v1")
    assert first.rc == 0, first.output
    assert all(current_in(bed, v, root) == "releases/v1" for v in bed.vmids)

    again = pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v1")
    assert again.rc == 0, again.output
    assert [again.changed(h) for h in hosts] == [0, 0], again.output

    assert pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v2").rc == 0
    clean = pct_playbook("verify.yml")
    assert clean.rc == 0, clean.output
    assert {h: r["verdict"] for h, r in clean.report["hosts"].items()} == dict.fromkeys(hosts, "ok")

    edited, untouched = bed.vmids[1], bed.vmids[0]
    bed.attach(edited, "sh", "-c", f"echo '# hot fix' >> {root}/current/dflash/train.py")
    drift = pct_playbook("verify.yml")
    assert drift.rc != 0
    verdicts = drift.report["hosts"]
    assert verdicts[bed.hostname(untouched)]["verdict"] == "ok"
    assert verdicts[bed.hostname(edited)]["verdict"] == "drift"
    assert [f["path"] for f in verdicts[bed.hostname(edited)]["findings"]] == ["dflash/train.py"]

    back = pct_playbook("rollback.yml", dflash_source_dir=repo)
    assert back.rc == 0, back.output
    assert all(current_in(bed, v, root) == "releases/v1" for v in bed.vmids)
    assert pct_playbook("verify.yml").rc == 0


def test_unreachable_node_is_reported_and_the_others_deployed(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    down, up = bed.vmids[0], bed.vmids[1]
    closed_port = {"ansible_port": 1, "proxmox_api_port": 1}
    run = pct_playbook(
        "deploy.yml", host_vars={down: closed_port}, dflash_source_dir=repo, dflash_ref="v1"
    )
    assert run.rc != 0
    assert run.recap[bed.hostname(up)]["failed"] == 0
    assert run.recap[bed.hostname(down)]["failed"] + run.recap[bed.hostname(down)]["unreachable"]
    assert current_in(bed, up, pct_playbook.root) == "releases/v1"

    audit = pct_playbook("verify.yml", host_vars={down: closed_port})
    assert audit.rc != 0
    assert audit.report["hosts"][bed.hostname(down)]["verdict"] == "unreachable"
    assert audit.report["hosts"][bed.hostname(up)]["verdict"] == "ok"


def test_stopped_container_fails_unless_start_is_asked(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    stopped = bed.vmids[0]
    bed.stop_container(stopped)
    refused = pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v1")
    assert refused.rc != 0
    assert str(stopped) in refused.output and "start_if_stopped" in refused.output
    assert bed.status(stopped) == "stopped"

    started = pct_playbook(
        "deploy.yml", dflash_source_dir=repo, dflash_ref="v1", dflash_proxmox_start_if_stopped=True
    )
    assert started.rc == 0, started.output
    assert bed.status(stopped) == "running"
    assert current_in(bed, stopped, pct_playbook.root) == "releases/v1"


def test_missing_gpu_and_unknown_vmid_are_refused_before_any_change(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    no_gpu = pct_playbook(
        "deploy.yml", dflash_source_dir=repo, dflash_ref="v1", dflash_proxmox_gpus=[0]
    )
    assert no_gpu.rc != 0
    assert "/dev/nvidia0" in no_gpu.output
    for vmid in bed.vmids:
        probe = bed.attach(vmid, "test", "-e", f"{pct_playbook.root}/current", check=False)
        assert probe.returncode != 0, "a host without the GPU was deployed to"

    wrong, right = bed.vmids
    unknown = pct_playbook(
        "deploy.yml", host_vars={wrong: {"proxmox_vmid": 999}},
        dflash_source_dir=repo, dflash_ref="v1",
    )  # fmt: skip
    assert unknown.rc != 0
    assert "999" in unknown.output
    assert unknown.recap[bed.hostname(wrong)]["failed"] == 1
    # The other container is not held back by its neighbour's bad inventory entry.
    assert unknown.recap[bed.hostname(right)]["failed"] == 0
    assert current_in(bed, right, pct_playbook.root) == "releases/v1"
    probe = bed.attach(wrong, "test", "-e", f"{pct_playbook.root}/current", check=False)
    assert probe.returncode != 0


def test_real_trainer_runs_healthy_in_every_container(bed, pct_playbook, trainer_repo):
    """The real trainer, launched over pct in both containers, proven healthy, then audited."""
    args = {"target_model": "tiny", "gen_samples": 64}
    run = pct_playbook(
        "deploy.yml", dflash_source_dir=str(trainer_repo), dflash_ref="v1", dflash_launch=True,
        dflash_trainer_args=args, dflash_health_timeout=240,
    )  # fmt: skip
    try:
        assert run.rc == 0, run.output
        root = pct_playbook.root
        for vmid in bed.vmids:
            status = json.loads(bed.attach(vmid, "cat", f"{root}/runs/latest/status.json").stdout)
            manifest = json.loads(bed.attach(vmid, "cat", f"{root}/current/MANIFEST.json").stdout)
            assert status["state"] == "running" and status["step"] >= 1
            assert status["code_tree_sha256"] == manifest["tree_sha256"]
        again = pct_playbook(
            "deploy.yml", dflash_source_dir=str(trainer_repo), dflash_ref="v1",
            dflash_launch=True, dflash_trainer_args=args,
        )  # fmt: skip
        assert [again.changed(bed.hostname(v)) for v in bed.vmids] == [0, 0], again.output
        audit = pct_playbook("verify.yml")
        assert audit.rc == 0, audit.output

        # Drift in the containers: run.sh edited in one, the trainer killed in the other.
        edited, killed = bed.vmids
        bed.attach(edited, "sh", "-c", f"echo '# by hand' >> {root}/run.sh")
        bed.attach(killed, "pkill", "-KILL", "-f", "dflash[.]train")
        time.sleep(1)
        drift = pct_playbook("verify.yml")
        assert drift.rc != 0
        kinds = {
            host: [f["kind"] for f in result["findings"]]
            for host, result in drift.report["hosts"].items()
        }
        assert kinds == {
            bed.hostname(edited): ["run_script"],
            bed.hostname(killed): ["not_running"],
        }
    finally:
        assert pct_playbook("playbooks/stop.yml").rc == 0
