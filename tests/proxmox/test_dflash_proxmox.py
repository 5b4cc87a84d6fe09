"""library/dflash_proxmox.py through real ansible-playbook runs: proxmoxer's ssh backend against
the node's sshd and `pvesh` double, one module run per container, delegated to the controller."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.testbed.bed import Testbed
from tests.testbed.node.pveconf import Section
from tests.testbed.sshd import free_port

from .ansible_run import PlayRun, preflight_play, run_playbook

pytestmark = pytest.mark.testbed

WHEELHOUSE = [{"path": "/mnt/wheelhouse"}]


def run(
    bed: Testbed, tmp_path: Path, args: dict, check: bool = False, **inventory: object
) -> dict[str, dict]:
    result: PlayRun = run_playbook(
        [preflight_play(args)],
        bed.inventory(**inventory),
        tmp_path,
        check=check,  # type: ignore[arg-type]
    )
    return {host: res for host, res in result.results("preflight").items()}


def changes(bed: Testbed, since: int) -> list[list[str]]:
    """pvesh calls that change something (create/set/delete) since the mark."""
    return [e["argv"] for e in bed.trace(since, tool="pvesh") if e["subcommand"] != "get"]


def test_ready_container_passes_and_an_unknown_vmid_fails(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    mark = bed.trace_mark()
    results = run(bed, tmp_path, {"mounts": WHEELHOUSE}, host_vars={second: {"proxmox_vmid": 999}})
    ok, unknown = results[bed.hostname(first)], results[bed.hostname(second)]
    assert not ok.get("failed"), ok
    assert ok["changed"] is False and ok["status"] == "running" and ok["started"] is False
    assert ok["config"]["mounts"]["/mnt/wheelhouse"] == {
        "key": "mp0", "source": str(bed.wheelhouse), "read_only": True,
    }  # fmt: skip
    assert ok["config"]["hostname"] == f"ct{first}" and ok["config"]["gpus"] == {}
    assert unknown["failed"] is True
    assert unknown["msg"] == (
        f"container 999 does not exist on node {bed.node} (containers there: "
        f"{', '.join(map(str, bed.vmids))}); check the host's proxmox_vmid and node"
    )
    assert changes(bed, mark) == []


def test_stopped_container_is_started_only_when_asked(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    bed.stop_container(first)
    bed.stop_container(second)
    results = run(
        bed, tmp_path, {"start_if_stopped": "{{ start_it }}", "start_timeout": 20},
        host_vars={first: {"start_it": True}, second: {"start_it": False}},
    )  # fmt: skip
    started, refused = results[bed.hostname(first)], results[bed.hostname(second)]
    assert not started.get("failed"), started
    assert started["changed"] is True and started["started"] is True
    assert started["status"] == "running" and bed.status(first) == "running"
    assert started["actions"] == [f"started container {first} (it was stopped)"]
    assert refused["failed"] is True and refused["changed"] is False
    assert (
        f"container {second} on node {bed.node} is stopped; start it (pct start {second}) or "
        "set start_if_stopped: true"
    ) in refused["msg"]
    assert bed.status(second) == "stopped"


def test_gpu_passthrough_is_checked(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    # first: GPU 0 as devN, GPU 1 as lxc.mount.entry with its cgroup rule: all there
    bed.edit_config(
        first,
        values={"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"},
        lxc=[("lxc.cgroup2.devices.allow", "c 195:* rwm"),
             ("lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file")],
    )  # fmt: skip
    # second: GPU 0 fine, GPU 1 mounted without a cgroup rule, GPU 2 missing
    bed.edit_config(
        second,
        values={"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"},
        lxc=[("lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file")],
    )
    results = run(
        bed, tmp_path, {"gpus": "{{ want_gpus }}"},
        host_vars={first: {"want_gpus": [0, 1]}, second: {"want_gpus": [0, 1, 2]}},
    )  # fmt: skip
    ok, bad = results[bed.hostname(first)], results[bed.hostname(second)]
    assert not ok.get("failed"), ok
    assert ok["config"]["gpus"] == {
        "0": "dev0: /dev/nvidia0",
        "1": "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
    }
    assert bad["failed"] is True and "(2 problems)" in bad["msg"]
    assert (
        f"GPU 2 (/dev/nvidia2) is not passed through to container {second}; add "
        f"'dev3: /dev/nvidia2' to its config (pct set {second} -dev3 /dev/nvidia2)"
    ) in bad["msg"]
    assert f"GPU 1 (/dev/nvidia1) is mounted into container {second}" in bad["msg"]
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in bad["msg"]
    assert "GPU 0" not in bad["msg"]


def test_control_devices_are_required_with_any_gpu(bed: Testbed, tmp_path: Path) -> None:
    first = bed.vmids[0]
    bed.edit_config(first, values={"dev0": "/dev/nvidia0"})
    result = run(bed, tmp_path, {"gpus": [0]}, vmids=[first])[bed.hostname(first)]
    assert result["failed"] is True and "(2 problems)" in result["msg"]
    assert "the NVIDIA control device (/dev/nvidiactl)" in result["msg"]
    assert "'dev1: /dev/nvidiactl'" in result["msg"] and "'dev2: /dev/nvidia-uvm'" in result["msg"]


def test_missing_or_wrong_mount_point_fails(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    bed.edit_config(first, delete=["mp0"])
    results = run(
        bed, tmp_path, {"mounts": [{"path": "/mnt/wheelhouse", "source": "{{ wheel_src }}"}]},
        host_vars={first: {"wheel_src": str(bed.wheelhouse)}, second: {"wheel_src": "/srv/other"}},
    )  # fmt: skip
    gone, wrong = results[bed.hostname(first)], results[bed.hostname(second)]
    assert gone["failed"] is True
    assert (
        f"container {first} has no mount point at /mnt/wheelhouse; add one, e.g. 'mp0: "
        f"{bed.wheelhouse},mp=/mnt/wheelhouse' (pct set {first} -mp0 {bed.wheelhouse},"
        "mp=/mnt/wheelhouse)"
    ) in gone["msg"]
    assert wrong["failed"] is True
    assert (
        f"mount point /mnt/wheelhouse of container {second} comes from {bed.wheelhouse} (mp0), "
        "expected /srv/other"
    ) in wrong["msg"]


def _seed_snapshots(bed: Testbed, vmid: int) -> None:
    """Two old snapshots of ours and one of the user's, as Proxmox would have them."""
    conf = bed.read_config(vmid)
    parent = None
    for name, when in (("dflash-predeploy-20200101000000", 1577836800),
                       ("manual", 1577900000),
                       ("dflash-predeploy-20200102000000", 1577923200)):  # fmt: skip
        snap = Section(dict(conf.current.options), [], "")
        snap.options["snaptime"] = str(when)
        if parent:
            snap.options["parent"] = parent
        conf.snapshots[name] = snap
        parent = name
    conf.current.options["parent"] = parent  # type: ignore[assignment]
    bed.write_config(vmid, conf)


def test_snapshot_with_retention_keeps_the_newest_of_ours(bed: Testbed, tmp_path: Path) -> None:
    first = bed.vmids[0]
    _seed_snapshots(bed, first)
    args = {"snapshot": {"name_prefix": "dflash-predeploy", "retain": 2}}
    result = run(bed, tmp_path, args, vmids=[first])[bed.hostname(first)]
    assert not result.get("failed"), result
    created = result["snapshot"]["created"]
    assert re.fullmatch(r"dflash-predeploy-\d{14}", created)
    assert result["snapshot"]["removed"] == ["dflash-predeploy-20200101000000"]
    assert result["snapshot"]["kept"] == ["dflash-predeploy-20200102000000", created]
    assert result["changed"] is True
    assert sorted(bed.snapshots(first)) == sorted(
        ["manual", "dflash-predeploy-20200102000000", created]
    )
    conf = bed.read_config(first)
    assert conf.current.options["parent"] == created
    assert conf.snapshots[created].options["parent"] == "dflash-predeploy-20200102000000"
    # the removed snapshot's child now hangs off the removed one's parent (none)
    assert "parent" not in conf.snapshots["manual"].options


def test_retain_zero_is_refused_before_anything_changes(bed: Testbed, tmp_path: Path) -> None:
    first = bed.vmids[0]
    _seed_snapshots(bed, first)
    bed.stop_container(first)
    before, mark = bed.config_text(first), bed.trace_mark()
    args = {"start_if_stopped": True, "snapshot": {"retain": 0}}
    result = run(bed, tmp_path, args, vmids=[first])[bed.hostname(first)]
    assert result["failed"] is True and result["changed"] is False
    assert "snapshot.retain is 0: it must be at least 1" in result["msg"]
    assert "nothing was changed" in result["msg"]
    assert bed.config_text(first) == before
    assert bed.status(first) == "stopped"
    assert bed.trace(since=mark) == []  # refused before even connecting


def test_check_mode_reports_and_changes_nothing(bed: Testbed, tmp_path: Path) -> None:
    first = bed.vmids[0]
    _seed_snapshots(bed, first)
    bed.stop_container(first)
    before, mark = bed.config_text(first), bed.trace_mark()
    args = {"start_if_stopped": True, "snapshot": {"retain": 1}}
    result = run(bed, tmp_path, args, check=True, vmids=[first])[bed.hostname(first)]
    assert not result.get("failed"), result
    assert result["changed"] is True and result["started"] is True
    would = result["snapshot"]["created"]
    assert result["actions"] == [
        f"would start container {first} (it is stopped)",
        f"would take snapshot {would}",
        "would delete snapshot dflash-predeploy-20200101000000 (retention)",
        "would delete snapshot dflash-predeploy-20200102000000 (retention)",
    ]
    assert bed.config_text(first) == before
    assert bed.status(first) == "stopped"
    assert changes(bed, mark) == []


def test_unreachable_node_and_unknown_node_fail_clearly(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    closed = free_port()
    results = run(
        bed, tmp_path, {"timeout": 5},
        host_vars={first: {"proxmox_api_port": closed}, second: {"proxmox_node": "pve2"}},
    )  # fmt: skip
    down, elsewhere = results[bed.hostname(first)], results[bed.hostname(second)]
    assert down["failed"] is True
    assert down["msg"].startswith(
        f"cannot reach the Proxmox API of node {bed.node} at ssh root@127.0.0.1:{closed} "
        "(backend ssh_paramiko): "
    )
    assert "Unable to connect" in down["msg"] or "refused" in down["msg"]
    assert elsewhere["failed"] is True
    assert elsewhere["msg"] == (
        f"node 'pve2' is not known to the Proxmox API (nodes: {bed.node}); set node to the one "
        f"that holds container {second}"
    )
