"""The node's `pct` and `pvesh` doubles, seen the way their clients see them: through the node's
sshd (as the proxmox_pct_remote plugin does) and through real proxmoxer (ssh_paramiko backend)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from proxmoxer import ProxmoxAPI, ResourceException

from tests.testbed.bed import Testbed

pytestmark = pytest.mark.testbed


def missing(bed: Testbed, vmid: int) -> str:
    return f"Configuration file 'nodes/{bed.node}/lxc/{vmid}.conf' does not exist"


def wait(api: ProxmoxAPI, node: str, upid: str) -> dict[str, Any]:
    """Poll a task until it stops (proxmoxer.tools would, but it needs requests installed)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        task = api.nodes(node).tasks(upid).status.get()
        if task["status"] == "stopped":
            return task
        time.sleep(0.2)
    raise AssertionError(f"task {upid} still running")


@pytest.fixture
def api(bed: Testbed) -> ProxmoxAPI:
    return ProxmoxAPI(bed.host, backend="ssh_paramiko", user=bed.user, port=bed.port,
                      private_key_file=str(bed.private_key), timeout=10)  # fmt: skip


def test_pct_list_status_and_config_formats(bed: Testbed) -> None:
    first, second = bed.vmids[:2]
    bed.stop_container(second)
    bed.edit_config(first, lxc=[("lxc.cgroup2.devices.allow", "c 195:* rwm")])
    rc, out, err = bed.ssh_run("/usr/sbin/pct list")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert lines[1].split() == [str(first), "running", f"ct{first}"]
    assert lines[2].split() == [str(second), "stopped", f"ct{second}"]
    assert lines[0].index("Status") == 11 and lines[0].index("Name") == 35  # %-10s %-10s %-12s

    assert bed.ssh_run(f"/usr/sbin/pct status {first}") == (0, "status: running\n", "")
    assert bed.ssh_run(f"/usr/sbin/pct status {second}") == (0, "status: stopped\n", "")

    rc, out, _ = bed.ssh_run(f"/usr/sbin/pct config {first}")
    keys = [line.split(":", 1)[0] for line in out.splitlines()]
    assert rc == 0
    assert keys[:-1] == sorted(keys[:-1]) and "digest" not in keys
    assert out.splitlines()[-1] == "lxc.cgroup2.devices.allow: c 195:* rwm"  # raw keys last
    assert f"mp0: {bed.wheelhouse},mp=/mnt/wheelhouse,ro=1" in out.splitlines()


def test_pct_errors_are_proxmox_texts_and_codes(bed: Testbed) -> None:
    assert bed.ssh_run("/usr/sbin/pct status 999") == (2, "", missing(bed, 999) + "\n")
    assert bed.ssh_run("/usr/sbin/pct exec 999 -- true") == (2, "", missing(bed, 999) + "\n")
    rc, _, err = bed.ssh_run("/usr/sbin/pct status abc")
    assert rc == 255
    assert err.startswith("400 Parameter verification failed.\nvmid: type check ('integer')")
    rc, _, err = bed.ssh_run("/usr/sbin/pct frobnicate 200")
    assert rc == 255 and err.startswith("ERROR: unknown command 'pct frobnicate'")
    vmid = bed.vmids[1]
    bed.stop_container(vmid)
    assert bed.ssh_run(f"/usr/sbin/pct stop {vmid}") == (255, "", f"CT {vmid} not running\n")
    rc, _, err = bed.ssh_run(f"/usr/sbin/pct exec {vmid} -- true")
    assert rc != 0 and "lxc-attach" in err  # what Proxmox's lxc-attach says, too
    assert bed.ssh_run(f"/usr/sbin/pct start {vmid}") == (0, "", "")
    assert bed.status(vmid) == "running"
    rc, _, err = bed.ssh_run(f"/usr/sbin/pct start {vmid}")
    assert (rc, err) == (255, f"CT {vmid} already running\n")


def test_pct_exec_runs_the_command_with_a_clean_environment(bed: Testbed) -> None:
    vmid = bed.vmids[0]
    rc, out, err = bed.ssh_run(
        f"LEAK=1 /usr/sbin/pct exec {vmid} -- /bin/sh -c 'env | sort; echo oops >&2; exit 3'"
    )
    assert rc == 3 and err == "oops\n"
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    assert env["HOME"] == "/root" and env["LANG"] == "C.UTF-8"
    assert "LEAK" not in env and not any(k.startswith("SSH_") for k in env)
    # the plugin's form: the whole command as one string after `--`, parsed by the node's shell
    assert bed.ssh_run(f"/usr/sbin/pct exec {vmid} -- /bin/sh -c 'echo ~root && sleep 0'") == (
        0, "/root\n", "",
    )  # fmt: skip


def test_pvesh_json_contract(bed: Testbed) -> None:
    vmid = bed.vmids[0]
    rc, out, err = bed.ssh_run(f"pvesh get /nodes/{bed.node}/lxc/{vmid}/status/current "
                               "--output-format json")  # fmt: skip
    assert (rc, err) == (0, "")
    status = json.loads(out)  # bare JSON, not {"data": ...}
    assert status["status"] == "running" and status["vmid"] == vmid and status["pid"] > 1
    rc, out, err = bed.ssh_run(f"pvesh get /nodes/{bed.node}/lxc/999/config --output-format json")
    assert (out, err) == ("", missing(bed, 999) + "\n")
    rc, out, err = bed.ssh_run(f"pvesh get /nodes/{bed.node}/nope --output-format json")
    assert (rc, out, err) == (1, "", f"No 'get' handler defined for '/nodes/{bed.node}/nope'\n")
    rc, out, err = bed.ssh_run(f"pvesh create /nodes/{bed.node}/lxc/{vmid}/snapshot "
                               "-snapname 1bad --output-format json")  # fmt: skip
    assert out == "" and err.splitlines()[0] == "400 Parameter verification failed."
    assert "snapname: invalid format" in err
    rc, out, err = bed.ssh_run("pvesh get /nodes/elsewhere/lxc --output-format json")
    assert out == "" and err.startswith("hostname lookup 'elsewhere' failed")


def test_proxmoxer_reads_lists_starts_and_snapshots(bed: Testbed, api: ProxmoxAPI) -> None:
    first, second = bed.vmids[:2]
    assert {c["vmid"] for c in api.nodes(bed.node).lxc.get()} == set(bed.vmids)
    with pytest.raises(ResourceException) as failure:
        api.nodes(bed.node).lxc(999).status.current.get()
    assert failure.value.status_code == 500
    assert missing(bed, 999) in str(failure.value)

    bed.edit_config(first, lxc=[("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind 0 0")])
    config = api.nodes(bed.node).lxc(first).config.get()
    assert config["memory"] == 2048 and config["hostname"] == f"ct{first}"
    assert config["lxc"] == [["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind 0 0"]]
    assert re.fullmatch(r"[0-9a-f]{40}", config["digest"])

    bed.stop_container(second)
    upid = api.nodes(bed.node).lxc(second).status.start.post()
    assert re.fullmatch(rf"UPID:{bed.node}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:vzstart:"
                        rf"{second}:root@pam:", upid)  # fmt: skip
    assert wait(api, bed.node, upid)["exitstatus"] == "OK"
    assert api.nodes(bed.node).lxc(second).status.current.get()["status"] == "running"
    assert bed.status(second) == "running"

    upid = api.nodes(bed.node).lxc(second).snapshot.post(snapname="before", description="d")
    assert wait(api, bed.node, upid)["exitstatus"] == "OK"
    snaps = {s["name"]: s for s in api.nodes(bed.node).lxc(second).snapshot.get()}
    assert set(snaps) == {"before", "current"}
    assert snaps["current"]["parent"] == "before" and snaps["before"]["description"] == "d"
    assert "[before]" in bed.config_text(second)
    upid = api.nodes(bed.node).lxc(second).snapshot("before").delete()
    assert wait(api, bed.node, upid)["exitstatus"] == "OK"
    assert bed.snapshots(second) == []
    assert "parent:" not in bed.config_text(second)


def test_trace_counts_pct_exec_per_container(bed: Testbed) -> None:
    first, second = bed.vmids[:2]
    mark = bed.trace_mark()
    for _ in range(3):
        bed.ssh_run(f"/usr/sbin/pct exec {first} -- true")
    bed.ssh_run(f"/usr/sbin/pct exec {second} -- true")
    bed.ssh_run(f"/usr/sbin/pct status {second}")
    assert bed.pct_exec_counts(since=mark) == {first: 3, second: 1}
    entries = bed.trace(since=mark)
    assert [e["subcommand"] for e in entries] == ["exec"] * 4 + ["status"]
    assert entries[0]["argv"] == ["exec", str(first), "--", "true"]
