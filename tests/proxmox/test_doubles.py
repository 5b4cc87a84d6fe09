"""The node's doubles, seen the way their clients see them: `pct` and `pvesh` through the node's
sshd (as the proxmox_pct_remote plugin and proxmoxer's SSH backends do), and the HTTPS API
through real requests and proxmoxer with an API token. Each checks a Proxmox VE 8 behaviour the
double models (the source it follows is named in the double's docstring)."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from proxmoxer import ProxmoxAPI, ResourceException

from tests.testbed.bed import API_USER, Testbed

from .conftest import https_api, newer_debian

pytestmark = pytest.mark.testbed


def missing(bed: Testbed, vmid: int) -> str:
    return f"Configuration file 'nodes/{bed.node}/lxc/{vmid}.conf' does not exist"


def wait(api: ProxmoxAPI, node: str, upid: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = api.nodes(node).tasks(upid).status.get()
        if task["status"] == "stopped":
            return task
        time.sleep(0.1)
    raise AssertionError(f"task {upid} still running")


def get(bed: Testbed, path: str, token: str | None = "deploy", **params: Any) -> requests.Response:
    """A raw GET of the HTTPS API, trusting the bed's CA."""
    headers = {}
    if token:
        headers["Authorization"] = f"PVEAPIToken={API_USER}!{token}={bed.token_secret(token)}"
    return requests.get(
        f"{bed.api_url}/api2/json{path}",
        params=params,
        headers=headers,
        verify=str(bed.ca_file),
        timeout=30,
    )


# --- pct and pvesh over SSH -----------------------------------------------------------------
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
    assert "unprivileged: 1" in out.splitlines()


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
    # pct.pm `exec`: a stopped container is refused before lxc-attach runs
    assert bed.ssh_run(f"/usr/sbin/pct exec {vmid} -- true") == (
        255,
        "",
        f"container '{vmid}' not running!\n",
    )
    assert bed.ssh_run(f"/usr/sbin/pct start {vmid}") == (0, "", "")
    assert bed.status(vmid) == "running"
    rc, _, err = bed.ssh_run(f"/usr/sbin/pct start {vmid}")
    assert (rc, err) == (255, f"CT {vmid} already running\n")


def test_pct_exec_keeps_the_node_environment(bed: Testbed) -> None:
    """PVE 8's `pct exec` defaults to --keep-env 1: the SSH session's variables reach the
    command, less SSL_CERT_FILE/SSL_CERT_DIR; PATH is what PVE::CLIHandler sets."""
    vmid = bed.vmids[0]
    script = "env | sort; echo oops >&2; exit 3"
    rc, out, err = bed.ssh_run(
        f"LEAK=1 SSL_CERT_FILE=/x /usr/sbin/pct exec {vmid} -- /bin/sh -c '{script}'"
    )
    assert rc == 3 and err == "oops\n"
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    assert env["LEAK"] == "1" and env["SSH_CONNECTION"].startswith("127.0.0.1 ")
    assert "SSL_CERT_FILE" not in env
    assert not any(k.startswith("DFLASH_TESTBED") for k in env)  # the double's own, not Proxmox's
    # --keep-env 0 (PVE 9's default): a clean environment
    rc, out, _ = bed.ssh_run(f"LEAK=1 /usr/sbin/pct exec {vmid} --keep-env 0 -- env")
    assert rc == 0 and "LEAK=1" not in out and "SSH_CONNECTION" not in out
    # the plugin's form: the whole command as one string after `--`, parsed by the node's shell
    assert bed.ssh_run(f"/usr/sbin/pct exec {vmid} -- /bin/sh -c 'echo ~root && sleep 0'") == (
        0,
        "/root\n",
        "",
    )


def test_pvesh_json_contract_and_proxmoxer_over_ssh(bed: Testbed) -> None:
    vmid = bed.vmids[0]
    rc, out, err = bed.ssh_run(
        f"pvesh get /nodes/{bed.node}/lxc/{vmid}/status/current --output-format json"
    )
    assert (rc, err) == (0, "")
    status = json.loads(out)  # bare JSON, not {"data": ...}
    assert status["status"] == "running" and status["vmid"] == vmid and status["pid"] > 1
    rc, out, err = bed.ssh_run(f"pvesh get /nodes/{bed.node}/lxc/999/config --output-format json")
    assert (out, err) == ("", missing(bed, 999) + "\n")
    rc, out, err = bed.ssh_run(f"pvesh get /nodes/{bed.node}/nope --output-format json")
    assert (rc, out, err) == (1, "", f"No 'get' handler defined for '/nodes/{bed.node}/nope'\n")
    rc, out, err = bed.ssh_run(
        f"pvesh create /nodes/{bed.node}/lxc/{vmid}/snapshot -snapname 1bad --output-format json"
    )
    assert out == "" and err.splitlines()[0] == "400 Parameter verification failed."
    assert "snapname: invalid format - invalid configuration ID '1bad'" in err
    rc, out, err = bed.ssh_run("pvesh get /nodes/elsewhere/lxc --output-format json")
    assert out == "" and err.startswith("hostname lookup 'elsewhere' failed")
    # proxmoxer's ssh backend runs pvesh as root@pam: tasks run in the foreground
    ssh = ProxmoxAPI(
        bed.host,
        backend="ssh_paramiko",
        user=bed.user,
        port=bed.port,
        private_key_file=str(bed.private_key),
        timeout=10,
    )
    assert {c["vmid"] for c in ssh.nodes(bed.node).lxc.get()} == set(bed.vmids)
    bed.stop_container(vmid)
    upid = ssh.nodes(bed.node).lxc(vmid).status.start.post()
    assert re.fullmatch(
        rf"UPID:{bed.node}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:vzstart:"
        rf"{vmid}:root@pam:",
        upid,
    )
    assert ssh.nodes(bed.node).tasks(upid).status.get()["exitstatus"] == "OK"
    assert bed.status(vmid) == "running"


# --- the HTTPS API ---------------------------------------------------------------------------
def test_https_api_wraps_data_and_answers_errors_as_proxmox(bed: Testbed) -> None:
    vmid = bed.vmids[0]
    ok = get(bed, f"/nodes/{bed.node}/lxc/{vmid}/status/current")
    assert ok.status_code == 200 and ok.headers["Content-Type"].startswith("application/json")
    assert ok.json()["data"]["status"] == "running" and set(ok.json()) == {"data"}
    # a parameter error: 400, the reason phrase, per-key errors
    bad = get(bed, f"/nodes/{bed.node}/lxc/{vmid}/feature", feature="frobnicate")
    assert (bad.status_code, bad.reason) == (400, "Parameter verification failed.")
    assert bad.json()["errors"] == {
        "feature": "value 'frobnicate' does not have a value in "
        "the enumeration 'snapshot, clone, copy'"
    }
    # a die in a handler: 500 with its text as the reason
    gone = get(bed, f"/nodes/{bed.node}/lxc/{vmid}/config", snapshot="nosuch")
    assert (gone.status_code, gone.reason) == (500, "snapshot 'nosuch' does not exist")
    assert gone.json() == {"data": None, "message": "snapshot 'nosuch' does not exist\n"}
    nope = get(bed, f"/nodes/{bed.node}/nope")
    assert (nope.status_code, nope.reason) == (
        501,
        f"Method 'GET /nodes/{bed.node}/nope' not implemented",
    )
    # no token, or a wrong one: 401, after the 3 s every unauthorized call waits
    began = time.monotonic()
    anonymous = get(bed, "/version", token=None)
    assert (anonymous.status_code, anonymous.reason) == (401, "No ticket")
    assert time.monotonic() - began >= 3
    wrong = requests.get(
        f"{bed.api_url}/api2/json/version",
        verify=str(bed.ca_file),
        timeout=30,
        headers={"Authorization": f"PVEAPIToken={API_USER}!deploy=wrong"},
    )
    assert (wrong.status_code, wrong.reason) == (401, "Authentication failed!")
    # TLS: the bed's certificate is signed by its CA, not by one the system trusts
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{bed.api_url}/api2/json/version", timeout=10)


def test_privilege_separated_token_sees_only_its_containers(bed: Testbed) -> None:
    mine, other = bed.vmids[:2]
    bed.add_token("one", {f"/vms/{mine}": "PVEVMAdmin"})
    api = https_api(bed, "one")
    # lists are filtered by VM.Audit, never refused
    assert [c["vmid"] for c in api.nodes(bed.node).lxc.get()] == [mine]
    assert [r["vmid"] for r in api.cluster.resources.get(type="vm")] == [mine]
    # the rest answers 403 with Proxmox's text, before the container is even looked up
    for path in (f"/nodes/{bed.node}/lxc/{other}/config", f"/nodes/{bed.node}/lxc/999/config"):
        denied = get(bed, path, token="one")
        vmid = path.split("/")[4]
        assert (denied.status_code, denied.reason) == (
            403,
            f"Permission check failed (/vms/{vmid}, VM.Audit)",
        )
    with pytest.raises(
        ResourceException,
        match=rf"Permission check failed \(/vms/{other}, "
        r"VM.PowerMgmt\)",
    ):
        api.nodes(bed.node).lxc(other).status.stop.post()
    # a token's own privileges (AccessControl.pm `permissions`): the intersection with its user's
    privs = api.access.permissions.get(path=f"/vms/{mine}")[f"/vms/{mine}"]
    assert {"VM.Audit", "VM.Snapshot", "VM.PowerMgmt"} <= set(privs)
    assert api.access.permissions.get(path=f"/vms/{other}") == {f"/vms/{other}": {}}
    # tasks: a token sees its own; another token's needs Sys.Audit on the node
    upid = https_api(bed).nodes(bed.node).lxc(mine).snapshot.post(snapname="probe")
    refused = get(bed, f"/nodes/{bed.node}/tasks/{upid}/status", token="one")
    assert (refused.status_code, refused.reason) == (
        403,
        f"Permission check failed (/nodes/{bed.node}, Sys.Audit)",
    )


def test_tasks_are_asynchronous_and_end_ok_warnings_or_an_error(
    bed: Testbed, api: ProxmoxAPI
) -> None:
    first, second = bed.vmids[:2]
    bed.stop_container(first)
    # The task is held until the test lets it go: the UPID comes back while it runs, however
    # slow a loaded machine answers the POST.
    bed.delay_tasks("vzstart", 600)
    upid = api.nodes(bed.node).lxc(first).status.start.post()
    running = api.nodes(bed.node).tasks(upid).status.get()
    assert running["status"] == "running" and "exitstatus" not in running
    assert (running["user"], running["tokenid"], running["type"]) == (API_USER, "deploy", "vzstart")
    assert bed.status(first) == "stopped"
    bed.delay_tasks("vzstart", 0)
    assert wait(api, bed.node, upid)["exitstatus"] == "OK"
    assert bed.status(first) == "running"
    # WARNINGS: a Debian newer than pve-container has tested (LXC/Setup/Debian.pm) - success
    with newer_debian(bed, second):
        bed.stop_container(second)
        upid = api.nodes(bed.node).lxc(second).status.start.post()
        assert wait(api, bed.node, upid)["exitstatus"] == "WARNINGS: 1"
    log = api.nodes(bed.node).tasks(upid).log.get()
    assert log[0]["t"].startswith(
        "WARN: The container's Debian version '15' is newer than the tested version '14'."
    )
    assert log[-1] == {"n": len(log), "t": "TASK WARNINGS: 1"}
    assert bed.status(second) == "running"
    # an error: the message is the exit status, and the log's last line
    upid = api.nodes(bed.node).lxc(second).snapshot.post(snapname="before")
    assert wait(api, bed.node, upid)["exitstatus"] == "snapshot feature is not available"
    tail = get(bed, f"/nodes/{bed.node}/tasks/{upid}/log", start=0, limit=0).json()
    assert tail["data"][-1]["t"] == "TASK ERROR: snapshot feature is not available"
    assert tail["total"] == len(tail["data"])


def pvesh_set(bed: Testbed, vmid: int, *args: str) -> tuple[int, str, str]:
    """`pvesh set .../config` on the node, as root@pam: only root@pam may set a devN or a bind
    mount point (pve-container LXC.pm `check_ct_modify_config_perm`), which the bed's token,
    a privilege-separated dflash@pve one, may not."""
    path = f"/nodes/{bed.node}/lxc/{vmid}/config"
    return bed.ssh_run(["/usr/bin/pvesh", "set", path, *args])


def test_config_current_vs_pending_and_devn_needs_the_device(bed: Testbed, api: ProxmoxAPI) -> None:
    vmid = bed.vmids[0]
    ct = api.nodes(bed.node).lxc(vmid)
    # while it runs
    assert pvesh_set(bed, vmid, "-dev0", "/dev/null", "-tags", "dflash", "-delete", "features") == (
        0, "", "")  # fmt: skip
    # devN and the removal wait for the next start; tags are hotplugged
    assert ct.config.get()["dev0"] == "/dev/null" and "features" not in ct.config.get()
    current = ct.config.get(current=1)
    assert "dev0" not in current and current["features"] == "nesting=1"
    assert current["tags"] == "dflash"
    pending = {item["key"]: item for item in ct.pending.get()}
    assert pending["dev0"] == {"key": "dev0", "pending": "/dev/null"}
    assert pending["features"] == {"key": "features", "value": "nesting=1", "delete": 1}
    wait(api, bed.node, ct.status.stop.post())
    assert wait(api, bed.node, ct.status.start.post())["exitstatus"] == "OK"
    # the start applied them (LXC/Config.pm vmconfig_apply_pending)
    applied = ct.config.get(current=1)
    assert applied["dev0"] == "/dev/null" and "features" not in applied
    assert [item for item in ct.pending.get() if "pending" in item or "delete" in item] == []
    # a devN whose device the node lacks is refused when it is set, running or not, and nothing
    # is written (pve-container 5.0.10+, LXC/Config.pm update_pct_config ->
    # LXC/Tools.pm get_device_mode_and_rdev: a plain die, exit 255)
    for state in ("running", "stopped"):
        before = bed.config_text(vmid)
        assert pvesh_set(bed, vmid, "-dev1", "/dev/nvidia0", "-tags", "x") == (
            255, "", "Device /dev/nvidia0 does not exist\n")  # fmt: skip
        assert bed.config_text(vmid) == before
        if state == "running":
            wait(api, bed.node, ct.status.stop.post())
    # ... but a config edited by hand (or whose device went away) fails at start
    bed.edit_config(vmid, values={"dev1": "/dev/nvidia0"})
    failed = wait(api, bed.node, ct.status.start.post())
    assert failed["exitstatus"] == "Device /dev/nvidia0 does not exist"
    assert bed.status(vmid) == "stopped"
    # and any later set writes the config, then dies in LXC.pm update_lxc_config
    assert pvesh_set(bed, vmid, "-tags", "later") == (
        255, "", "Device /dev/nvidia0 does not exist\n")  # fmt: skip
    assert "tags: later" in bed.config_text(vmid).splitlines()


def test_a_new_mount_point_is_hotplugged_into_a_running_container(
    bed: Testbed, api: ProxmoxAPI, tmp_path: Path
) -> None:
    """LXC/Config.pm vmconfig_hotplug_pending -> apply_pending_mountpoint -> LXC.pm
    mountpoint_hotplug: a new mpN goes into the running container at once; one that replaces
    an mpN it has, and a removal, wait for the next start."""
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "f").write_text("one\n")
    (tmp_path / "two").mkdir()
    try:
        for vmid in bed.vmids:  # unprivileged, and the privileged last one
            ct = api.nodes(bed.node).lxc(vmid)
            mp1 = f"{tmp_path / 'one'},mp=/mnt/extra/one,ro=1"
            assert pvesh_set(bed, vmid, "-mp1", mp1) == (0, "", "")
            assert ct.config.get(current=1)["mp1"] == mp1
            assert [i for i in ct.pending.get() if "pending" in i or "delete" in i] == []
            assert bed.attach(vmid, "cat", "/mnt/extra/one/f").stdout == "one\n"
            wrote = bed.attach(vmid, "touch", "/mnt/extra/one/g", check=False)
            assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr
            owner = bed.attach(vmid, "stat", "-c", "%u", "/mnt/extra").stdout.strip()
            assert owner == "0"  # made by the hotplug, owned by the container's root
            # over an mpN it has: pending (apply_pending_mountpoint: "skip")
            mp1_new = f"{tmp_path / 'two'},mp=/mnt/extra/one"
            assert pvesh_set(bed, vmid, "-mp1", mp1_new) == (0, "", "")
            assert ct.config.get(current=1)["mp1"] == mp1
            assert {"key": "mp1", "value": mp1, "pending": mp1_new} in ct.pending.get()
            # a hotplug that fails refuses the whole set: HTTP 400 (pvesh: exit 255), nothing
            # written (API2/LXC/Config.pm update_vm: raise_param_exc($errors))
            before = bed.config_text(vmid)
            rc, out, err = pvesh_set(bed, vmid, "-mp2", f"{tmp_path / 'gone'},mp=/mnt/gone")
            assert (rc, out) == (255, "")
            assert err == (
                f"400 Parameter verification failed.\nmp2: unable to hotplug mp2: directory "
                f"'{tmp_path / 'gone'}' does not exist\n"
            )
            assert bed.config_text(vmid) == before
            # a removal waits
            assert pvesh_set(bed, vmid, "-delete", "mp0") == (0, "", "")
            assert "mp0" in ct.config.get(current=1)
            assert bed.attach(vmid, "test", "-d", "/mnt/wheelhouse").returncode == 0
    finally:
        for vmid in bed.vmids:  # the hotplugged mounts go with the container (reset starts it)
            bed.stop_container(vmid)


def test_snapshot_rules_follow_proxmox(bed: Testbed, api: ProxmoxAPI) -> None:
    bound, free = bed.vmids[:2]
    bed.edit_config(free, delete=["mp0"])  # rootfs on LVM-thin only: snapshots possible
    snap = api.nodes(bed.node).lxc(free).snapshot
    assert api.nodes(bed.node).lxc(bound).feature.get(feature="snapshot") == {"hasFeature": 0}
    assert api.nodes(bed.node).lxc(free).feature.get(feature="snapshot") == {"hasFeature": 1}
    with pytest.raises(ResourceException) as too_long:
        snap.post(snapname="s" * 41)
    assert too_long.value.errors == {"snapname": "value may only be 40 characters long"}
    for reserved in ("vzdump", "current"):
        with pytest.raises(
            ResourceException,
            match=f"unable to use snapshot name '{reserved}' "
            r"\(reserved name\)",
        ):
            snap.post(snapname=reserved)
    assert wait(api, bed.node, snap.post(snapname="s" * 40))["exitstatus"] == "OK"
    again = wait(api, bed.node, snap.post(snapname="s" * 40))
    assert again["exitstatus"] == f"snapshot name '{'s' * 40}' already used"
    # a bind mount point, or a rootfs on storage without snapshots: the task fails
    bed.edit_config(free, values={"rootfs": f"local:{free}/vm-{free}-disk-0.raw,size=8G"})
    for vmid in (bound, free):
        upid = api.nodes(bed.node).lxc(vmid).snapshot.post(snapname="later")
        assert wait(api, bed.node, upid)["exitstatus"] == "snapshot feature is not available"


def test_unprivileged_and_privileged_containers(bed: Testbed) -> None:
    unpriv = next(v for v in bed.vmids if bed.unprivileged(v))
    [priv] = bed.privileged
    assert bed.attach(unpriv, "cat", "/proc/self/uid_map").stdout.split() == [
        "0",
        "100000",
        "65536",
    ]
    assert bed.attach(priv, "cat", "/proc/self/uid_map").stdout.split() == ["0", "0", "4294967295"]
    (bed.wheelhouse / "probe.whl").write_bytes(b"x")
    # node files bind-mounted into an unprivileged container belong to nobody there
    owners = bed.attach(unpriv, "stat", "-c", "%u:%g %A", "/mnt/wheelhouse/probe.whl").stdout
    assert owners.split() == ["65534:65534", "-rw-r--r--"]
    assert bed.attach(priv, "stat", "-c", "%u:%g", "/mnt/wheelhouse/probe.whl").stdout.strip() == (
        "0:0"
    )
    write = bed.attach(unpriv, "touch", "/mnt/wheelhouse/new", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    # root inside owns what it writes; on the node that is uid 100000
    bed.attach(unpriv, "sh", "-c", "echo x > /root/made-here")
    made = bed.root / "lxc" / str(unpriv) / "delta" / "root" / "made-here"
    assert (made.stat().st_uid, made.stat().st_gid) == (100000, 100000)


def test_cgroup2_device_rules_are_enforced_and_v1_keys_ignored(bed: Testbed) -> None:
    """The bed's devices: fake NVIDIA nodes (no driver behind them: an allowed open fails with
    ENXIO, a denied one with EPERM). Proxmox VE 8 enforces lxc.cgroup2.devices rules (cgroup v2);
    this machine has cgroup v1, so the bed applies the cgroup2 rules through v1's devices
    controller and drops the v1 keys, as PVE 8 ignores them."""
    vmid = bed.vmids[0]
    dev = bed.root / "node-dev"
    dev.mkdir(exist_ok=True)
    for minor in (0, 1):
        node = dev / f"nvidia{minor}"
        if not node.exists():
            os.mknod(node, stat.S_IFCHR, os.makedev(195, minor))
            node.chmod(0o666)  # crw-rw-rw-, as the driver's nodes are
    bed.stop_container(vmid)
    bed.edit_config(
        vmid,
        lxc=[
            ("lxc.cgroup2.devices.allow", "c 195:0 rwm"),
            ("lxc.cgroup.devices.allow", "c 195:1 rwm"),
            *[
                ("lxc.mount.entry", f"{dev}/nvidia{m} dev/nvidia{m} none bind,create=file 0 0")
                for m in (0, 1)
            ],
        ],
    )
    bed.start_container(vmid)
    probe = (
        "import errno, os\nfor m in (0, 1):\n    try:\n"
        "        os.close(os.open(f'/dev/nvidia{m}', os.O_RDWR))\n    except OSError as e:\n"
        "        print(m, errno.errorcode[e.errno])\n"
    )
    found = bed.attach(vmid, "python3", "-c", probe).stdout.split()
    assert found == ["0", "ENXIO", "1", "EPERM"]


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
