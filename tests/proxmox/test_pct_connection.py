"""The dflash_pct connection (connection_plugins/dflash_pct.py) on the test bed: a module task is
one `pct exec` (pipelining), what goes on stdin (a long line, binary data, a large module
argument) arrives intact because no PTY sits in between, put and fetch round-trip byte for byte,
and one SSH client serves the connections of a process. The plain proxmox_pct_remote runs the
same play for comparison. Counts come from the pct double's trace, never from timings."""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, init_plugin_loader

from tests.testbed.bed import PLAIN_PCT_CONNECTION, Testbed

from .ansible_run import REPO, run_playbook

pytestmark = pytest.mark.testbed

# A module of the test (found in the playbook's library/ folder): what it saw on its stdin and
# of its argument.
PROBE = """#!/usr/bin/python
import hashlib
import os

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"blob": {"type": "str", "default": ""}})
    blob = module.params["blob"].encode()
    module.exit_json(changed=False, stdin_is_tty=os.isatty(0), size=len(blob),
                     sha256=hashlib.sha256(blob).hexdigest())


main()
"""


def probe_play(blob: str) -> list[dict]:
    tasks = [
        {"name": "ping", "ansible.builtin.ping": {}},
        {"name": "command", "ansible.builtin.command": {"cmd": "true"}, "changed_when": False},
        {"name": "stat", "ansible.builtin.stat": {"path": "/etc/hostname"}},
        {"name": "probe", "stdin_probe": {"blob": blob}},
    ]
    return [{"hosts": "all", "gather_facts": False, "tasks": tasks}]


@pytest.mark.parametrize("connection", ["dflash_pct", PLAIN_PCT_CONNECTION])
def test_a_module_task_is_one_pct_exec(bed: Testbed, tmp_path: Path, connection: str) -> None:
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "stdin_probe.py").write_text(PROBE)
    # A large argument on one line: 2 MiB without a newline (a terminal cuts a line at 4096).
    blob = "".join(random.Random(19).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=2 << 20))
    inventory = bed.inventory(tmp_path / "inventory.yml", connection=connection)
    mark = bed.trace_mark()
    run = run_playbook(probe_play(blob), inventory, tmp_path)
    assert run.rc == 0, (run.output, run.stderr[-3000:])
    counts = bed.pct_exec_counts(mark)
    probe = run.results("probe")
    for vmid in bed.vmids:
        seen = probe[bed.hostname(vmid)]
        assert (seen["size"], seen["sha256"]) == (
            len(blob),
            hashlib.sha256(blob.encode()).hexdigest(),
        )
        if connection == "dflash_pct":
            # pipelined: the module is the stdin of its one pct exec, no PTY, no temp files
            assert counts[vmid] == 4, bed.trace(mark, tool="pct")
            assert seen["stdin_is_tty"] is False
        else:
            # home, temp folder, upload, chmod, run, clean-up: at least five per task
            assert counts[vmid] >= 5 * 4, counts
    if connection == "dflash_pct":
        argv = [e["argv"] for e in bed.trace(mark, tool="pct") if e["subcommand"] == "exec"]
        assert all(a[3:] == ["/bin/sh", "-c", "/usr/bin/python3 && sleep 0"] for a in argv), argv


def test_put_and_fetch_round_trip_byte_for_byte(bed: Testbed, tmp_path: Path) -> None:
    # Every byte value (a terminal would eat ^C/^D and turn \r into \n), long runs without a
    # newline, and 6 MiB of noise: more than paramiko's 2 MiB window, so the send must wait.
    data = bytes(range(256)) * 4096 + random.Random(19).randbytes(6 << 20)
    source = tmp_path / "blob.bin"
    source.write_bytes(data)
    fetched = tmp_path / "fetched"
    target = "/tmp/dflash pct/blob 'one'.bin"  # a space and quotes: paths are quoted
    folder = {"path": "/tmp/dflash pct", "state": "directory", "mode": "0755"}
    fetch = {"src": target, "dest": f"{fetched}/{{{{ inventory_hostname }}}}.bin", "flat": True}
    tasks = [
        {"name": "folder", "ansible.builtin.file": folder},
        {
            "name": "put",
            "ansible.builtin.copy": {"src": str(source), "dest": target, "mode": "0644"},
        },
        {"name": "sum", "ansible.builtin.stat": {"path": target, "checksum_algorithm": "sha256"}},
        {"name": "fetch", "ansible.builtin.fetch": fetch},
    ]
    inventory = bed.inventory(tmp_path / "inventory.yml")
    run = run_playbook(
        [{"hosts": "all", "gather_facts": False, "tasks": tasks}], inventory, tmp_path
    )
    assert run.rc == 0, (run.output, run.stderr[-3000:])
    for vmid in bed.vmids:
        host = bed.hostname(vmid)
        assert run.results("sum")[host]["stat"]["checksum"] == hashlib.sha256(data).hexdigest()
        assert (fetched / f"{host}.bin").read_bytes() == data


def connection_to(bed: Testbed, vmid: int):
    """The plugin as Ansible loads it, with the options an inventory would give it."""
    conn = connection_loader.get("dflash_pct", PlayContext(), None)
    conn.set_options(var_options={
        "ansible_host": bed.host, "ansible_port": bed.port, "ansible_user": bed.user,
        "ansible_ssh_private_key_file": str(bed.private_key), "ansible_host_key_checking": False,
        "proxmox_vmid": vmid, "dflash_pct_ssh_transport": "paramiko"})  # fmt: skip
    return conn


def test_one_ssh_client_serves_every_connection_of_a_process(bed: Testbed) -> None:
    init_plugin_loader()
    connection_loader.add_directory(str(REPO / "connection_plugins"))
    first, second = (connection_to(bed, vmid) for vmid in bed.vmids[:2])
    rc, out, _ = first.exec_command("hostname")
    assert (rc, out.strip()) == (0, f"ct{bed.vmids[0]}".encode())
    first.close()  # what Ansible does after every task: the node's connection stays open
    rc, out, _ = second.exec_command("hostname")
    assert (rc, out.strip()) == (0, f"ct{bed.vmids[1]}".encode())
    assert second.ssh is first.ssh and second.ssh.get_transport().is_active()
    # Input without a PTY, stderr apart from stdout, the exit status kept.
    rc, out, err = second.exec_command("/bin/sh -c 'wc -c; echo oops >&2; exit 3'",
                                       in_data=b"x" * 100_000 + b"\x04\r\n")  # fmt: skip
    assert (rc, out.strip(), err.strip()) == (3, b"100003", b"oops")
    # meta: reset_connection gets a new SSH connection, not the shared one.
    shared = second.ssh
    second.reset()
    assert second.ssh is not shared and not shared.get_transport()
    second.close()


def test_openssh_transport_shares_one_connection_per_node(bed: Testbed, tmp_path: Path) -> None:
    """ssh_transport=openssh (the default): every task of a play on every container, each in
    its own Ansible worker process, runs over one SSH connection to the node (its
    ControlMaster); what goes on stdin still arrives intact, a module task is still one pct
    exec, and put/fetch round-trip."""
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "stdin_probe.py").write_text(PROBE)
    blob = "".join(random.Random(7).choices("abcdefghijklmnopqrstuvwxyz", k=1 << 20))
    data = bytes(range(256)) * 1024
    (tmp_path / "blob.bin").write_bytes(data)
    control = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))  # a socket path is short
    openssh = {"dflash_pct_ssh_transport": "openssh", "dflash_pct_control_path_dir": str(control),
               "dflash_pct_control_persist": 10}  # fmt: skip
    play = probe_play(blob)
    play[0]["tasks"] += [
        {"name": "put", "ansible.builtin.copy": {"src": str(tmp_path / "blob.bin"),
                                                 "dest": "/tmp/blob.bin", "mode": "0644"}},
        {"name": "fetch", "ansible.builtin.fetch": {
            "src": "/tmp/blob.bin", "dest": f"{tmp_path}/got-{{{{ inventory_hostname }}}}",
            "flat": True}},
    ]  # fmt: skip
    inventory = bed.inventory(tmp_path / "inventory.yml", group_vars=openssh)
    mark = bed.trace_mark()
    try:
        run = run_playbook(play, inventory, tmp_path)
    finally:
        for socket_file in control.iterdir():  # the master exits now, not in 10 s
            subprocess.run(["ssh", "-o", f"ControlPath={socket_file}", "-O", "exit", "x"],
                           capture_output=True, timeout=30, check=False)  # fmt: skip
        shutil.rmtree(control, ignore_errors=True)
    assert run.rc == 0, (run.output, run.stderr[-3000:])
    for vmid in bed.vmids:
        seen = run.results("probe")[bed.hostname(vmid)]
        assert seen["sha256"] == hashlib.sha256(blob.encode()).hexdigest()
        assert seen["stdin_is_tty"] is False
        assert (tmp_path / f"got-{bed.hostname(vmid)}").read_bytes() == data
    # 4 module tasks of one pct exec each, copy's and fetch's few: as over paramiko.
    counts = bed.pct_exec_counts(mark)
    assert all(counts[vmid] >= 4 for vmid in bed.vmids), counts
    assert len(bed.ssh_connections(mark)) == 1, bed.ssh_connections(mark)


def test_the_paramiko_transport_opens_a_connection_per_worker(bed: Testbed, tmp_path: Path) -> None:
    """paramiko, for the comparison: each Ansible worker its own connection."""
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "stdin_probe.py").write_text(PROBE)
    paramiko = {"dflash_pct_ssh_transport": "paramiko"}  # whatever DFLASH_PCT_SSH_TRANSPORT says
    inventory = bed.inventory(tmp_path / "inventory.yml", group_vars=paramiko)
    mark = bed.trace_mark()
    run = run_playbook(probe_play("x"), inventory, tmp_path)
    assert run.rc == 0, (run.output, run.stderr[-3000:])
    assert len(bed.ssh_connections(mark)) >= 4 * len(bed.vmids)  # a worker per task and host


def test_an_unknown_node_key_is_refused_with_the_command_that_adds_it(
    bed: Testbed, tmp_path: Path
) -> None:
    """Over OpenSSH (the default) host keys are checked without a question (BatchMode): a node
    not in known_hosts is unreachable, and the message says how to add its key."""
    home = tmp_path / "home"  # an empty ~/.ssh/known_hosts, whatever this machine's has
    (home / ".ssh").mkdir(parents=True)
    control = tempfile.mkdtemp(prefix="cp", dir="/tmp")  # a socket path is short
    checked = {"ansible_host_key_checking": True, "dflash_pct_control_path_dir": control}
    inventory = bed.inventory(tmp_path / "inventory.yml", vmids=bed.vmids[:1], group_vars=checked)
    play = [{"hosts": "all", "gather_facts": False,
             "tasks": [{"name": "ping", "ansible.builtin.ping": {}}]}]  # fmt: skip
    run = run_playbook(play, inventory, tmp_path, env={"HOME": str(home)})
    [result] = run.results("ping").values()
    assert result["unreachable"] is True, result
    assert "Host key verification failed" in result["msg"]
    assert f"ssh-keyscan -p {bed.port} {bed.host} >> ~/.ssh/known_hosts" in result["msg"]
