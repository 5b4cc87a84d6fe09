"""The test bed itself: SSH + `pct exec` through the real proxmox_pct_remote plugin, the
wheelhouse in every container, the trace, and a bring-up/tear-down that leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import registry
from tests.testbed.bed import Testbed
from tests.testbed.node import lxcctl
from tests.testbed.procs import start_time
from tests.testbed.sshd import free_port
from tests.testbed.teardown import reap_stale

from .ansible_run import REPO, run_playbook

pytestmark = pytest.mark.testbed


def test_ping_copy_and_wheelhouse_through_the_pct_plugin(bed: Testbed, tmp_path: Path) -> None:
    (bed.wheelhouse / "torch-0.0.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(200_000))
    mark = bed.trace_mark()
    plays = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {"name": "ping", "ansible.builtin.ping": {}},
                {"name": "copy", "ansible.builtin.copy": {"src": str(payload),
                                                          "dest": "/root/payload.bin"}},
                {"name": "sum", "ansible.builtin.command": "sha256sum /root/payload.bin"},
                {"name": "wheelhouse", "ansible.builtin.command": f"ls {bed.wheelhouse_ct}"},
                {"name": "read-only", "ansible.builtin.command": f"touch {bed.wheelhouse_ct}/x",
                 "ignore_errors": True},
                {"name": "hostname", "ansible.builtin.command": "hostname"},
            ],
        }
    ]  # fmt: skip
    run = run_playbook(plays, bed.inventory(), tmp_path)
    assert run.rc == 0, run.output
    digest = subprocess.run(["sha256sum", str(payload)], capture_output=True, text=True)
    for vmid in bed.vmids:
        host = bed.hostname(vmid)
        assert run.results("ping")[host]["ping"] == "pong"
        assert run.results("copy")[host]["changed"] is True
        assert run.results("sum")[host]["stdout"].split()[0] == digest.stdout.split()[0]
        # Other tests of the session may have put wheels there too.
        assert "torch-0.0.0-py3-none-any.whl" in run.results("wheelhouse")[host]["stdout_lines"]
        assert "Read-only file system" in run.results("read-only")[host]["stderr"]
        # each host reached its own container
        assert run.results("hostname")[host]["stdout"] == f"ct{vmid}"
    counts = bed.pct_exec_counts(since=mark)
    assert set(counts) == set(bed.vmids)
    # every call went through /usr/sbin/pct exec; both hosts ran the same tasks
    assert counts[bed.vmids[0]] == counts[bed.vmids[1]] >= 6


def test_pct_is_the_double_only_inside_the_node_namespace(bed: Testbed) -> None:
    rc, out, _ = bed.ssh_run("head -2 /usr/sbin/pct; command -v pvesh")
    assert rc == 0
    assert "pct test double of the dflash test bed" in out
    assert out.strip().endswith("/usr/bin/pvesh")
    # the host's own /usr/sbin is untouched
    assert not Path("/usr/sbin/pct").exists() or "test double" not in Path(
        "/usr/sbin/pct"
    ).read_text(errors="replace")


def test_inventory_targets_the_containers_through_the_plugin(bed: Testbed, tmp_path: Path) -> None:
    inventory = json.loads(bed.inventory(tmp_path / "inv.yml", group="lxc").read_text())
    group = inventory["all"]["children"]["lxc"]
    assert group["hosts"] == {bed.hostname(v): {"proxmox_vmid": v} for v in bed.vmids}
    assert group["vars"]["ansible_connection"] == "dflash_pct"
    assert group["vars"]["ansible_port"] == bed.port
    assert Path(group["vars"]["ansible_ssh_private_key_file"]) == bed.private_key


def test_stop_start_and_delete_a_container(bed: Testbed) -> None:
    vmid = bed.vmids[1]
    bed.stop_container(vmid)
    assert bed.status(vmid) == "stopped"
    rc, out, _ = bed.ssh_run(f"/usr/sbin/pct status {vmid}")
    assert (rc, out) == (0, "status: stopped\n")
    bed.start_container(vmid)
    assert bed.attach(vmid, "hostname").stdout.strip() == f"ct{vmid}"
    bed.delete_container(vmid)
    rc, _, err = bed.ssh_run(f"/usr/sbin/pct status {vmid}")
    assert rc == 2
    assert err.strip() == f"Configuration file 'nodes/{bed.node}/lxc/{vmid}.conf' does not exist"
    bed.restore_container(vmid)
    assert bed.status(vmid) == "running"


def test_a_second_bed_comes_up_beside_and_goes_down_without_leftovers() -> None:
    other = Testbed.up(containers=1, name=f"t{os.getpid()}", log=lambda _m: None)
    vmid = other.vmids[0]
    state, pid = lxcctl.info(other.node_cfg, vmid)
    sshd_pid, api_pid, root = other.sshd.pid, other.api.pid, other.root  # type: ignore[union-attr]
    assert state == "running" and pid
    assert registry.path_for(other.name).exists()
    other.down()
    assert start_time(sshd_pid) is None, "sshd still running"
    assert start_time(api_pid) is None, "the HTTPS API still running"
    assert start_time(pid) is None, "container init still running"
    assert not root.exists()
    assert not registry.path_for(other.name).exists()
    assert str(root) not in Path("/proc/self/mountinfo").read_text()


def test_cli_up_status_down() -> None:
    name = f"cli{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "tests.testbed"]
    up = subprocess.run([*cli, "up", "--containers", "1", "--name", name], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        assert (
            "inventory:" in up.stdout and f"python -m tests.testbed down --name {name}" in up.stdout
        )
        state = json.loads(registry.path_for(name).read_text())
        assert state["owner"] is None  # persistent: outlives the CLI process
        assert start_time(state["sshd"]["pid"]) == state["sshd"]["started"]
        assert start_time(state["api"]["pid"]) == state["api"]["started"]
        status = subprocess.run([*cli, "status"], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert f"{name}: up, port {state['port']}" in status.stdout
    finally:
        down = subprocess.run([*cli, "down", "--name", name], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert start_time(state["sshd"]["pid"]) is None
    assert start_time(state["api"]["pid"]) is None
    assert not Path(state["root"]).exists()


def test_unreachable_node_is_reported_by_the_plugin(bed: Testbed, tmp_path: Path) -> None:
    plays = [{"hosts": "all", "gather_facts": False,
              "tasks": [{"name": "ping", "ansible.builtin.ping": {}}]}]  # fmt: skip
    run = run_playbook(plays, bed.inventory(port=free_port()), tmp_path)
    assert run.rc == 4  # ansible-playbook: some hosts unreachable
    for vmid in bed.vmids:
        result = run.results("ping")[bed.hostname(vmid)]
        assert result["unreachable"] is True
        assert "Connection refused" in result["msg"] or "Unable to connect" in result["msg"]


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _beds_of(pid: int) -> list[dict[str, Any]]:
    return [s for s in registry.load_all().values() if (s.get("owner") or {}).get("pid") == pid]


def test_a_killed_owner_leaves_a_bed_the_next_bring_up_removes() -> None:
    script = (
        "import os, signal\n"
        "from tests.testbed.bed import Testbed\n"
        "Testbed.up(containers=1, log=lambda m: None)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no finalizer\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env)
    proc.wait(timeout=120)
    assert proc.returncode == -9
    (stale,) = _beds_of(proc.pid)
    assert start_time(stale["sshd"]["pid"]) is not None  # still running: nobody cleaned up
    assert start_time(stale["api"]["pid"]) is not None
    reap_stale(lambda _m: None)  # what every bring-up does first
    assert start_time(stale["sshd"]["pid"]) is None and start_time(stale["api"]["pid"]) is None
    assert not Path(stale["root"]).exists()
    assert _beds_of(proc.pid) == []


@pytest.mark.parametrize("moment", ["during bring-up", "during the test"])
def test_sigterm_to_pytest_still_tears_the_bed_down(tmp_path: Path, moment: str) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.testbed.pytest_plugin import proxmox_testbed  # noqa: F401\n"
    )
    started = tmp_path / "test-started"
    (tmp_path / "test_sleep.py").write_text(
        "import time\nfrom pathlib import Path\n\n"
        f"def test_sleeps(proxmox_testbed):\n    Path({str(started)!r}).touch()\n"
        "    time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "DFLASH_TESTBED_CONTAINERS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    # sshd is recorded while the containers are still starting; the marker once the test runs.
    if moment == "during bring-up":
        ready = lambda: any(s.get("sshd") for s in _beds_of(proc.pid))  # noqa: E731
    else:
        ready = started.exists
    try:
        assert _wait_for(ready), f"never reached {moment}"
        (bed_state,) = _beds_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _beds_of(proc.pid) == [], output
    assert start_time(bed_state["sshd"]["pid"]) is None
    assert bed_state.get("api") is None or start_time(bed_state["api"]["pid"]) is None
    assert not Path(bed_state["root"]).exists()
