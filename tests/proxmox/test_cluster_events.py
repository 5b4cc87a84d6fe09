"""What a Proxmox VE 8 cluster does to a container between two deploys, provoked for real on the
bed (node/ops.py, node/ha.py) and answered by library/dflash_proxmox.py and
dflash_proxmox_snapshot.py: a lock held by another operation, a snapshot that locks and
freezes the container, an HA-managed start that returns before the container runs, and a
migration to another node. Every refusal comes before any change (no POST/PUT/DELETE)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.conftest import TRAINER_ARGS
from tests.testbed.bed import Testbed

from .ansible_run import run_playbook
from .test_dflash_proxmox import changes, run
from .test_inventory import dynamic_inventory

pytestmark = pytest.mark.testbed


@pytest.fixture(autouse=True)
def put_back(proxmox_testbed: Testbed) -> Iterator[None]:
    """Each test leaves the bed as it found it (a migrated or HA-managed container, faults):
    the session's fixtures that use it directly (bed_envs) do not reset it."""
    yield
    proxmox_testbed.reset()


def lxc_state(bed: Testbed, vmid: int) -> str:
    done = subprocess.run(["lxc-info", "-n", str(vmid), "-P", str(bed.node_cfg.lxcpath), "-s"],
                          capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    return done.stdout.split(":", 1)[1].strip()


def test_a_locked_container_is_refused_with_what_holds_it_and_pct_unlock(
    bed: Testbed, tmp_path: Path
) -> None:
    vmid = bed.vmids[0]
    bed.edit_config(vmid, values={"lock": "backup"})  # what vzdump leaves while it runs
    mark = bed.trace_mark()
    refused = run(bed, tmp_path, {}, vmids=[vmid])[bed.hostname(vmid)]
    assert refused["failed"] is True
    assert f"container {vmid} is locked (backup): a backup (vzdump) of it runs." in refused["msg"]
    assert f"release it on node {bed.node}: pct unlock {vmid}" in refused["msg"]
    assert changes(bed, mark) == []

    # The node refuses a start of the locked container with Proxmox's words.
    bed.stop_container(vmid)
    code, _, err = bed.ssh_run(["pct", "start", str(vmid)])
    assert code == 255 and "CT is locked (backup)" in err and bed.status(vmid) == "stopped"
    # The fix the message gives, run as written: the check then starts it.
    assert bed.ssh_run(["pct", "unlock", str(vmid)])[0] == 0
    started = run(bed, tmp_path, {"start_if_stopped": True}, vmids=[vmid])[bed.hostname(vmid)]
    assert not started.get("failed"), started
    assert bed.status(vmid) == "running"


def test_a_snapshot_locks_and_freezes_the_container_and_the_module_says_so(
    bed: Testbed, tmp_path: Path
) -> None:
    vmid = bed.vmids[0]
    bed.edit_config(vmid, delete=["mp0"])  # a container Proxmox can snapshot
    # A snapshot someone else takes (pct snapshot on the node) while the deploy checks: held
    # until the check is done (then set to 0), so that it still runs on a loaded machine.
    bed.set_fault("snapshot_seconds", 600)
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(bed.ssh_run, ["pct", "snapshot", str(vmid), "by-hand"])
        deadline = time.monotonic() + 30
        # Locked, then frozen (__snapshot_freeze: the processes stand still).
        while lxc_state(bed, vmid) != "FROZEN":
            assert time.monotonic() < deadline, lxc_state(bed, vmid)
            time.sleep(0.1)
        assert bed.read_config(vmid).current.options.get("lock") == "snapshot"
        mark = bed.trace_mark()
        refused = run(bed, tmp_path, {}, vmids=[vmid])[bed.hostname(vmid)]
        assert refused["failed"] is True and changes(bed, mark) == []
        assert "is locked (snapshot): a snapshot of it is being taken." in refused["msg"]
        bed.set_fault("snapshot_seconds", 0)
        assert other.result(timeout=120)[0] == 0
    assert lxc_state(bed, vmid) == "RUNNING"
    conf = bed.read_config(vmid)
    assert "lock" not in conf.current.options and conf.current.options["parent"] == "by-hand"
    assert "snapstate" not in conf.snapshots["by-hand"].options

    # The deploy's own snapshot of the running container: it says the trainer paused.
    bed.set_fault("snapshot_seconds", 4)
    result = run(bed, tmp_path, {"retain": 2}, "dflash_proxmox_snapshot", vmids=[vmid])
    taken = result[bed.hostname(vmid)]
    assert not taken.get("failed"), taken
    assert taken["snapshot"]["froze_running"] is True and taken["snapshot"]["seconds"] >= 4
    [said] = taken["actions"]
    assert re.fullmatch(
        r"took snapshot dflash-predeploy-\d{14} in [\d.]+ s; the container ran: Proxmox froze "
        r"its processes, the trainer's among them, for part of those [\d.]+ s \(.*\)",
        said,
    ), said


def test_an_ha_managed_start_is_waited_for_until_the_container_runs(
    bed: Testbed, tmp_path: Path
) -> None:
    vmid = bed.vmids[0]
    bed.ha_manage(vmid)
    bed.stop_container(vmid)
    bed.set_fault("ha_start_delay", 3)
    earlier = {kind: len(bed.task_results(kind, vmid)) for kind in ("hastart", "vzstart")}
    result = run(bed, tmp_path, {"start_if_stopped": True, "start_timeout": 60}, vmids=[vmid])
    started = result[bed.hostname(vmid)]
    assert not started.get("failed"), started
    assert bed.status(vmid) == "running"  # the module returned once it ran, not before
    [said] = started["actions"]
    assert re.fullmatch(
        rf"started container {vmid} \(it was stopped; HA-managed: the HA stack started it "
        r"\d+ s after the request\)",
        said,
    ), said
    # Proxmox's two tasks: the request (hastart, OK at once), then the LRM's vzstart.
    for kind in ("hastart", "vzstart"):
        assert [status for _, status in bed.task_results(kind, vmid)[earlier[kind] :]] == ["OK"]

    # A start the HA stack gives up on is named with its own error, before the timeout.
    bed.stop_container(vmid)
    with_device = {"dev0": "/dev/nvidia7"}  # a device this node lacks: the start fails
    conf = bed.read_config(vmid)
    conf.current.options.update(with_device)
    bed.write_config(vmid, conf)
    began = time.monotonic()
    result = run(bed, tmp_path, {"start_if_stopped": True, "start_timeout": 120}, vmids=[vmid])
    failed = result[bed.hostname(vmid)]
    assert failed["failed"] is True
    # The token cannot read root@pam's (the LRM's) task without Sys.Audit on the node, as on
    # Proxmox (Tasks.pm): the HA state `error` tells it.
    assert failed["msg"].startswith(
        f"container {vmid} is HA-managed: its start was requested, and the HA stack's start "
        f"failed on node {bed.node}: HA state error"
    ), failed["msg"]
    assert time.monotonic() - began < 100


def test_a_migrated_container_is_named_with_the_node_it_is_on_now(
    bed: Testbed, tmp_path: Path
) -> None:
    vmid = bed.vmids[0]
    bed.edit_config(vmid, values={"tags": "dflash"})
    bed.migrate(vmid, "pve2")
    # The example dynamic inventory finds it on the node it is on now.
    found = dynamic_inventory(bed, tmp_path)["_meta"]["hostvars"][bed.hostname(vmid)]
    assert (found["proxmox_node"], found["ansible_host"]) == ("pve2", "pve2")
    # On the old node, pct says what Proxmox says.
    code, _, err = bed.ssh_run(["pct", "exec", str(vmid), "--", "true"])
    assert code == 2, err
    assert f"Configuration file 'nodes/{bed.node}/lxc/{vmid}.conf' does not exist" in err
    mark = bed.trace_mark()
    refused = run(bed, tmp_path, {}, vmids=[vmid])[bed.hostname(vmid)]
    assert refused["failed"] is True and changes(bed, mark) == []
    assert refused["msg"].startswith(
        f"container {vmid} is on node pve2 now, not on {bed.node} (it was migrated there): set "
        "proxmox_node: pve2 for its host in the inventory"
    ), refused["msg"]
    # A task over pct in the moved container: the host is unreachable, with where to look.
    ping = run_playbook([{"hosts": "all", "gather_facts": False,
                          "tasks": [{"name": "ping", "ansible.builtin.ping": {}}]}],
                        bed.inventory(vmids=[vmid]), tmp_path)  # fmt: skip
    [result] = ping.results("ping").values()
    assert result["unreachable"] is True, result
    assert f"container {vmid} is not on the Proxmox node at 127.0.0.1" in result["msg"]
    assert "it was migrated to another node, or removed" in result["msg"]


def test_a_layout_over_the_memory_limit_is_refused_before_any_change(
    bed: Testbed, pct_playbook, trainer_repo
) -> None:
    vmid = bed.vmids[0]
    host, root = bed.hostname(vmid), pct_playbook.root
    bed.edit_config(vmid, values={"memory": "1024"})  # hotplugged on a running container
    mark = bed.trace_mark()
    run = pct_playbook(
        "deploy.yml", dflash_hosts=host, dflash_source_dir=str(trainer_repo), dflash_ref="v1",
        dflash_trainer_memory_mb=1536,
    )  # fmt: skip
    assert run.rc != 0
    assert (
        f"{host}: container {vmid} may use 1024 MB of memory (memory in its Proxmox config), and "
        "this layout runs 1 trainer process(es) of 1536 MB each (dflash_trainer_memory_mb): "
        f"1536 MB, which the kernel would answer by OOM-killing the trainer. Raise the limit "
        f"(pct set {vmid} -memory 1536), or run fewer processes; nothing was changed" in run.text
    ), run.output
    assert changes(bed, mark) == []
    assert bed.attach(vmid, "ls", "-A", root).stdout.split() == ["envs"]  # the seeded envs only


def test_an_oom_kill_in_the_container_is_reported_by_verify(
    bed: Testbed, pct_playbook, trainer_repo
) -> None:
    """The bed limits the container's memory cgroup (`memory` of its config), as a node does:
    a process over it is OOM-killed, and verify names the kill from the container's own
    memory.oom_control (counted since the trainer started)."""
    vmid = bed.vmids[0]
    host, root = bed.hostname(vmid), pct_playbook.root
    limit_mb = int(bed.read_config(vmid).current.options["memory"])
    run = pct_playbook(
        "deploy.yml", dflash_hosts=host, dflash_source_dir=str(trainer_repo), dflash_ref="v1",
        dflash_launch=True, dflash_trainer_args=TRAINER_ARGS,
    )  # fmt: skip
    try:
        assert run.rc == 0, run.output
        clean = pct_playbook("verify.yml", dflash_hosts=host)
        assert clean.rc == 0, clean.output
        # Beside the trainer, a process that goes over the limit: the kernel kills it.
        hog = f"x = bytearray({limit_mb + 256} << 20); x[::4096] = b'1' * len(x[::4096])"
        killed = bed.attach(vmid, "python3", "-c", hog, check=False)
        assert killed.returncode == 137, killed
        audit = pct_playbook("verify.yml", dflash_hosts=host)
    finally:
        assert pct_playbook("playbooks/stop.yml", dflash_hosts=host).rc == 0
    assert audit.rc != 0
    [item] = [f for f in audit.report["hosts"][host]["findings"] if f["kind"] == "oom_kill"]
    assert item["found"] == (
        f"1 process(es) OOM-killed by the kernel since then (the memory limit is {limit_mb} MB)"
    )
    assert json.loads(bed.attach(vmid, "cat", f"{root}/trainer.json").stdout)["oom_kills"] == 0
