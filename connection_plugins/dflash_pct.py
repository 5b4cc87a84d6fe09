# community.proxmox.proxmox_pct_remote with pipelining: a module travels on stdin of one
# `pct exec` (no temporary files), without a PTY, over one SSH connection per node and process.
# Over 300 lines because ~300 are the DOCUMENTATION that keeps every option of the plugin it
# extends (tests/unit/test_connection_docs.py); the code is ~200.
from __future__ import annotations

DOCUMENTATION = r"""
name: dflash_pct
short_description: Run tasks in Proxmox LXC containers with pct exec over SSH, pipelined
description:
  - Runs commands in, and copies files to and from, an LXC container of a Proxmox VE node. It
    connects to the node with SSH (paramiko) and runs C(/usr/sbin/pct exec VMID -- COMMAND) there.
  - Extends C(community.proxmox.proxmox_pct_remote), with the same options, in these ways.
  - Pipelining. A module's code goes to the container on the standard input of the one
    C(pct exec) that runs it, so a module task is one C(pct exec) instead of about six
    (home folder, temporary folder, upload, chmod, run, clean-up).
  - No PTY when data goes on standard input (pipelined modules, uploads). A terminal would echo
    the data, cut lines longer than 4096 bytes and read some bytes as control characters.
    Commands without input still get a PTY when O(pty) is true, as with the parent plugin.
  - Input is sent while the output is read, and every byte of it is sent. Paths in uploads and
    downloads are quoted for the container's shell.
  - With O(ssh_transport=paramiko), one SSH connection per node, user and credentials serves
    every connection of a process. Ansible forks a worker per task and host, so across tasks
    this saves nothing under C(ansible-playbook); it does inside one process that opens many
    connections.
  - By default (O(ssh_transport=openssh)) C(pct exec) goes through the OpenSSH client with a
    shared master connection (C(ControlMaster=auto), C(ControlPersist)). Every worker and task
    of a play, and the plays after it for O(control_persist) seconds, use one SSH connection
    per node. It takes keys (or an agent), not passwords, and never asks a question; a node
    whose host key is not in known_hosts is refused with the command that adds it. With
    O(password) set, a become method that answers a prompt, or no C(ssh) client on the
    controller, paramiko is used.
author: dflash-deploy
version_added: historical
requirements:
  - paramiko
  - the OpenSSH client (C(ssh)), for O(ssh_transport=openssh)
  - community.proxmox (the C(proxmox_pct_remote) connection plugin)
options:
  remote_addr:
    description:
      - Address of the Proxmox node (not of the container).
    default: inventory_hostname
    type: string
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_ssh_host
      - name: ansible_paramiko_host
  port:
    description:
      - SSH port of the node.
    type: int
    default: 22
    ini:
      - section: defaults
        key: remote_port
      - section: paramiko_connection
        key: remote_port
    env:
      - name: ANSIBLE_REMOTE_PORT
      - name: ANSIBLE_REMOTE_PARAMIKO_PORT
    vars:
      - name: ansible_port
      - name: ansible_ssh_port
      - name: ansible_paramiko_port
    keyword:
      - name: port
  remote_user:
    description:
      - User on the node. Other users than root run C(pct) through O(proxmox_become_method).
      - Also set by C(--user) or C(-u).
    type: string
    vars:
      - name: ansible_user
      - name: ansible_ssh_user
      - name: ansible_paramiko_user
    env:
      - name: ANSIBLE_REMOTE_USER
      - name: ANSIBLE_PARAMIKO_REMOTE_USER
    ini:
      - section: defaults
        key: remote_user
      - section: paramiko_connection
        key: remote_user
    keyword:
      - name: remote_user
  password:
    description:
      - Password of O(remote_user) on the node, or the passphrase of its SSH key.
      - Also set by C(--ask-pass).
    type: string
    vars:
      - name: ansible_password
      - name: ansible_ssh_pass
      - name: ansible_ssh_password
      - name: ansible_paramiko_pass
      - name: ansible_paramiko_password
  private_key_file:
    description:
      - SSH private key used to log in to the node.
    type: string
    ini:
      - section: defaults
        key: private_key_file
      - section: paramiko_connection
        key: private_key_file
    env:
      - name: ANSIBLE_PRIVATE_KEY_FILE
      - name: ANSIBLE_PARAMIKO_PRIVATE_KEY_FILE
    vars:
      - name: ansible_private_key_file
      - name: ansible_ssh_private_key_file
      - name: ansible_paramiko_private_key_file
    cli:
      - name: private_key_file
        option: "--private-key"
  vmid:
    description:
      - VMID of the container.
    type: int
    vars:
      - name: proxmox_vmid
  proxmox_become_method:
    description:
      - Command that runs C(pct) as root on the node when O(remote_user) is not root.
    type: str
    default: sudo
    vars:
      - name: proxmox_become_method
  pipelining:
    description:
      - Send each module on the standard input of the C(pct exec) that runs it, with no files
        written in the container. Turn it off only for a become method that needs a terminal.
    type: boolean
    default: true
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
      - section: paramiko_connection
        key: pipelining
    env:
      - name: ANSIBLE_PIPELINING
      - name: ANSIBLE_PARAMIKO_PIPELINING
    vars:
      - name: ansible_pipelining
      - name: ansible_paramiko_pipelining
  pty:
    description:
      - Give a PTY to commands that send nothing on standard input (C(sudo) with C(requiretty)
        needs one). Commands that send input never get one.
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PARAMIKO_PTY
    ini:
      - section: paramiko_connection
        key: pty
  host_key_checking:
    description:
      - Check the node's SSH host key against the known hosts files.
    type: boolean
    default: true
    env:
      - name: ANSIBLE_HOST_KEY_CHECKING
      - name: ANSIBLE_SSH_HOST_KEY_CHECKING
      - name: ANSIBLE_PARAMIKO_HOST_KEY_CHECKING
    ini:
      - section: defaults
        key: host_key_checking
      - section: paramiko_connection
        key: host_key_checking
    vars:
      - name: ansible_host_key_checking
      - name: ansible_ssh_host_key_checking
      - name: ansible_paramiko_host_key_checking
  host_key_auto_add:
    description:
      - Accept an unknown host key without asking, and record it.
    type: boolean
    env:
      - name: ANSIBLE_PARAMIKO_HOST_KEY_AUTO_ADD
    ini:
      - section: paramiko_connection
        key: host_key_auto_add
  record_host_keys:
    description:
      - Write host keys accepted in this run to C(~/.ssh/known_hosts).
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PARAMIKO_RECORD_HOST_KEYS
    ini:
      - section: paramiko_connection
        key: record_host_keys
  look_for_keys:
    description:
      - Also try the private keys found in C(~/.ssh/).
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PARAMIKO_LOOK_FOR_KEYS
    ini:
      - section: paramiko_connection
        key: look_for_keys
  use_rsa_sha2_algorithms:
    description:
      - Allow the RSA SHA-2 algorithms for public keys and host keys. V(false) behaves as
        paramiko before 2.9 did.
    type: boolean
    default: true
    vars:
      - name: ansible_paramiko_use_rsa_sha2_algorithms
    ini:
      - section: paramiko_connection
        key: use_rsa_sha2_algorithms
    env:
      - name: ANSIBLE_PARAMIKO_USE_RSA_SHA2_ALGORITHMS
  proxy_command:
    description:
      - Command whose standard input and output carry the SSH connection (a jump host);
        C(%h), C(%p) and C(%r) are replaced by the node's address, port and user.
    type: string
    default: ""
    env:
      - name: ANSIBLE_PARAMIKO_PROXY_COMMAND
    ini:
      - section: paramiko_connection
        key: proxy_command
    vars:
      - name: ansible_paramiko_proxy_command
  forward_agent:
    description:
      - Forward the SSH agent to the node.
    type: boolean
    default: false
    env:
      - name: ANSIBLE_PARAMIKO_FORWARD_AGENT
    ini:
      - section: paramiko_connection
        key: forward_agent
  use_persistent_connections:
    description:
      - Read by the parent plugin only to decide whether it may prompt about an unknown host
        key. This plugin does not use Ansible's persistent connection process.
    type: boolean
    default: false
    env:
      - name: ANSIBLE_USE_PERSISTENT_CONNECTIONS
    ini:
      - section: defaults
        key: use_persistent_connections
  banner_timeout:
    description:
      - Seconds to wait for the node's SSH banner.
    type: float
    default: 30
    ini:
      - section: paramiko_connection
        key: banner_timeout
    env:
      - name: ANSIBLE_PARAMIKO_BANNER_TIMEOUT
  timeout:
    description:
      - Seconds to wait for the TCP connection and for authentication.
    type: int
    default: 10
    ini:
      - section: defaults
        key: timeout
      - section: ssh_connection
        key: timeout
      - section: paramiko_connection
        key: timeout
    env:
      - name: ANSIBLE_TIMEOUT
      - name: ANSIBLE_SSH_TIMEOUT
      - name: ANSIBLE_PARAMIKO_TIMEOUT
    vars:
      - name: ansible_ssh_timeout
      - name: ansible_paramiko_timeout
    cli:
      - name: timeout
  ssh_transport:
    description:
      - How C(pct exec) reaches the node. V(openssh) shares one master connection per node
        among all Ansible worker processes; V(paramiko) opens a connection per worker (the
        parent plugin's way; it asks about an unknown host key on the terminal).
    type: str
    default: openssh
    choices: [paramiko, openssh]
    env:
      - name: DFLASH_PCT_SSH_TRANSPORT
    vars:
      - name: dflash_pct_ssh_transport
  control_path_dir:
    description:
      - Folder of the OpenSSH master connections' sockets (O(ssh_transport=openssh)).
    type: path
    default: ~/.ansible/cp
    env:
      - name: DFLASH_PCT_CONTROL_PATH_DIR
    vars:
      - name: dflash_pct_control_path_dir
  control_persist:
    description:
      - Seconds an idle OpenSSH master connection stays open (O(ssh_transport=openssh)).
    type: int
    default: 60
    env:
      - name: DFLASH_PCT_CONTROL_PERSIST
    vars:
      - name: dflash_pct_control_persist
  lock_file_timeout:
    description:
      - Seconds to wait for the lock on the known hosts file when writing new host keys.
    type: int
    default: 60
    vars:
      - name: ansible_lock_file_timeout
    env:
      - name: ANSIBLE_LOCK_FILE_TIMEOUT
notes:
  - Inside the container, C(/bin/sh) and C(cat) must be on the C(PATH), as for the parent plugin.
  - Pipelining is off whenever Ansible needs a file in the container anyway (C(async) tasks,
    C(ANSIBLE_KEEP_REMOTE_FILES)) or the become method cannot pipeline.
seealso:
  - name: community.proxmox.proxmox_pct_remote
    description: The connection plugin this one extends.
    link: https://docs.ansible.com/ansible/latest/collections/community/proxmox/proxmox_pct_remote_connection.html
"""

EXAMPLES = r"""
# Inventory: each host is a container; ansible_host is its Proxmox node.
all:
  children:
    dflash_targets:
      vars:
        ansible_connection: dflash_pct
        ansible_user: root
        ansible_python_interpreter: /usr/bin/python3
      hosts:
        trainer-a:
          ansible_host: 192.0.2.10
          proxmox_vmid: 200
"""

import atexit
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display
from ansible_collections.community.proxmox.plugins.connection.proxmox_pct_remote import (
    Connection as PctRemoteConnection,
)

try:
    import paramiko
except ImportError:  # the parent plugin's _connect names what is missing
    paramiko = None

display = Display()

CHUNK = 32768
# What the OpenSSH client itself prints when it could not run the command (exit 255).
SSH_FAILURE = re.compile(
    rb"^(ssh: |Permission denied|Host key verification failed|kex_exchange_identification|"
    rb"Connection (closed|reset|timed out)|ControlSocket|mux_client)",
    re.MULTILINE,
)
# Open SSH clients of this process. The pid is part of the key: a forked child must never use
# its parent's transport (its thread did not survive the fork, and the ciphers' counters would
# split between two processes).
_CLIENTS: dict[tuple, paramiko.SSHClient] = {}


def _close_clients() -> None:
    for key, client in list(_CLIENTS.items()):
        if key[0] == os.getpid():
            client.close()
        _CLIENTS.pop(key, None)


atexit.register(_close_clients)


def _drain(recv: Callable[[int], bytes]) -> bytes:
    parts = []
    while chunk := recv(CHUNK):
        parts.append(chunk)
    return b"".join(parts)


class Connection(PctRemoteConnection):
    """pct exec over SSH with pipelining, no PTY for input, and one SSH client per node."""

    transport = "dflash_pct"
    has_pipelining = True

    def _client_key(self) -> tuple:
        # Everything that decides where and as whom the client logged in, and how the host key
        # was checked: a client is shared only by connections that would have opened the same.
        secret = self.get_option("password")
        return (
            os.getpid(),
            str(self.get_option("remote_addr")).lower(),
            self.get_option("port"),
            self.get_option("remote_user"),
            self.get_option("private_key_file"),
            hashlib.sha256(to_bytes(secret)).hexdigest() if secret else None,
            self.get_option("proxy_command"),
            self.get_option("host_key_checking"),
            self.get_option("use_rsa_sha2_algorithms"),
        )

    def _openssh(self) -> bool:
        """Whether this connection goes through the OpenSSH client (see ssh_transport), decided
        at its first command (the become plugin is set by then) and kept: connect, every
        command and close ask, and a fallback to paramiko is warned about once."""
        if getattr(self, "_over_openssh", None) is None:
            self._over_openssh = self._choose_openssh()
        return self._over_openssh

    def _choose_openssh(self) -> bool:
        if self.get_option("ssh_transport") != "openssh":
            return False
        if self.get_option("password"):
            display.warning("dflash_pct: ssh_transport=openssh takes no password; using paramiko")
            return False
        if shutil.which("ssh") is None:
            display.warning(
                "dflash_pct: no OpenSSH client (ssh) on the controller's PATH; using paramiko "
                "(install openssh-client, or set dflash_pct_ssh_transport: paramiko)"
            )
            return False
        return not (self.become and self.become.expect_prompt())

    def _connect(self) -> Connection:
        if self._connected:
            return self
        if self._openssh():  # the ssh client connects (or shares the master) on every command
            self._connected = True
            return self
        key = self._client_key()
        client = _CLIENTS.get(key)
        transport = client.get_transport() if client else None
        if transport is not None and transport.is_active():
            display.vvv("REUSE SSH CONNECTION TO THE NODE", host=self.get_option("remote_addr"))
            self.ssh = client
            self.keyfile = os.path.expanduser("~/.ssh/known_hosts")
            self._connected = True
            return self
        super()._connect()
        _CLIENTS[key] = self.ssh
        return self

    def close(self) -> None:
        """Ansible calls this after every task: the SSH client stays open for the next
        connection of this process (closed at exit), unless host keys were accepted in this
        connection; then the parent records them in known_hosts and closes it."""
        if not self._connected:
            return
        if self._openssh():  # the master connection outlives the task (ControlPersist)
            self._connected = False
            return
        if (
            self.get_option("host_key_checking")
            and self.get_option("record_host_keys")
            and self._any_keys_added()
        ):
            _CLIENTS.pop(self._client_key(), None)
            super().close()
            return
        self._connected = False

    def reset(self) -> None:
        """meta: reset_connection opens a new SSH connection, not the cached one."""
        if not self._connected:
            return
        if self._openssh():  # the master exits; the next command opens a new one
            argv = self._ssh_argv(False)
            subprocess.run([*argv[:-2], "-O", "exit", argv[-2]], capture_output=True,
                           timeout=30, check=False)  # fmt: skip
            return
        _CLIENTS.pop(self._client_key(), None)
        super().close()
        self._connect()

    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = True
    ) -> tuple[int, bytes, bytes]:
        """Run cmd in the container; in_data goes to its standard input, never through a PTY."""
        if self.become and self.become.expect_prompt():
            # The parent answers the become prompt (it gives no PTY when sudoable is false).
            return super().exec_command(cmd, in_data=in_data, sudoable=sudoable and not in_data)
        pty = bool(self.get_option("pty") and sudoable and in_data is None)
        return self._run(self._build_pct_command(cmd), in_data, pty)

    def _control_path(self) -> str:
        """The master connection's socket: one per node, port, user and key (short: a socket
        path has at most 107 bytes)."""
        folder = os.path.expanduser(self.get_option("control_path_dir"))
        os.makedirs(folder, mode=0o700, exist_ok=True)
        who = [
            self.get_option(k) for k in ("remote_addr", "port", "remote_user", "private_key_file")
        ]
        return os.path.join(folder, hashlib.sha256(repr(who).encode()).hexdigest()[:20])

    def _ssh_argv(self, pty: bool, cmd: str = "", master: str = "auto") -> list[str]:
        """The OpenSSH client's command line: the node's shared master connection, never a
        question (BatchMode)."""
        argv = [
            "ssh", "-o", f"ControlMaster={master}", "-o", f"ControlPath={self._control_path()}",
            "-o", f"ControlPersist={self.get_option('control_persist')}s",
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.get_option('timeout')}",
            "-o", "ServerAliveInterval=5", "-p", str(self.get_option("port") or 22),
        ]  # fmt: skip
        if self.get_option("remote_user"):
            argv += ["-l", self.get_option("remote_user")]
        if self.get_option("private_key_file"):
            argv += ["-i", os.path.expanduser(self.get_option("private_key_file"))]
        if not self.get_option("host_key_checking"):
            argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        elif self.get_option("host_key_auto_add"):
            argv += ["-o", "StrictHostKeyChecking=accept-new"]
        if self.get_option("proxy_command"):  # %h, %p and %r mean the same to ssh
            argv += ["-o", f"ProxyCommand={self.get_option('proxy_command')}"]
        if self.get_option("forward_agent"):
            argv.append("-A")
        return [*argv, "-tt" if pty else "-T", str(self.get_option("remote_addr")), cmd]

    def _ensure_master(self) -> None:
        """Open the node's master connection once, under a lock: workers that start at the
        same moment would each open their own (ControlMaster=auto gives up sharing when two
        race for the socket). A master that died is replaced by the next command (auto)."""
        path = self._control_path()
        if os.path.exists(path):
            return
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path):
                return
            # -f: in the background once logged in, its output to /dev/null (a pipe would
            # stay open for as long as the master lives).
            argv = self._ssh_argv(False, master="yes")[:-1]
            with tempfile.TemporaryFile() as errors:
                subprocess.run([*argv[:-1], "-N", "-f", argv[-1]], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=errors, check=False,
                               timeout=self.get_option("timeout") + 30)  # fmt: skip

    def _run_openssh(self, cmd: str, in_data: bytes | None, pty: bool) -> tuple[int, bytes, bytes]:
        addr = self.get_option("remote_addr")
        display.vvv(f"EXEC (openssh) {cmd}{' (with input)' if in_data else ''}", host=addr)
        try:
            self._ensure_master()
            done = subprocess.run(
                self._ssh_argv(pty, cmd), input=in_data,
                stdin=subprocess.DEVNULL if in_data is None else None, capture_output=True,
                check=False,
            )  # fmt: skip
        except OSError as err:
            raise AnsibleConnectionFailure(f"cannot run the OpenSSH client: {err}") from err
        # 255 is ssh's own failure, and pct's too (`die`): ssh's say so on stderr.
        if done.returncode == 255 and SSH_FAILURE.search(done.stderr):
            raise AnsibleConnectionFailure(
                f"cannot reach the Proxmox node {addr} over SSH: {to_text(done.stderr).strip()}"
                + self._host_key_hint(done.stderr)
            )
        return done.returncode, done.stdout, done.stderr

    def _host_key_hint(self, stderr: bytes) -> str:
        """An unknown node key is refused (BatchMode asks nothing): the fix, not a prompt."""
        if b"Host key verification failed" not in stderr:
            return ""
        addr, port = self.get_option("remote_addr"), self.get_option("port") or 22
        return (
            f"; the node's host key is not in known_hosts: check it and add it (ssh -p {port} "
            f"root@{addr} once, or ssh-keyscan -p {port} {addr} >> ~/.ssh/known_hosts), or let "
            "new keys be added (ANSIBLE_PARAMIKO_HOST_KEY_AUTO_ADD=true)"
        )

    def _run(self, cmd: str, in_data: bytes | None, pty: bool) -> tuple[int, bytes, bytes]:
        ConnectionBase.exec_command(self, cmd, in_data=in_data)  # connects when needed
        if self._openssh():
            rc, stdout, err = self._run_openssh(cmd, in_data, pty)
            self._check_pct(rc, err)
            return rc, stdout, err
        addr = self.get_option("remote_addr")
        try:
            transport = self.ssh.get_transport()
            transport.set_keepalive(5)
            chan = transport.open_session()
        except Exception as err:
            raise AnsibleConnectionFailure(f"cannot open an SSH session on {addr}: {err}") from err
        if pty:
            chan.get_pty(term=os.getenv("TERM", "vt100"), width=int(os.getenv("COLUMNS", 0)),
                         height=int(os.getenv("LINES", 0)))  # fmt: skip
        if self.get_option("forward_agent"):
            paramiko.agent.AgentRequestHandler(chan)
        display.vvv(f"EXEC {cmd}{' (with input)' if in_data else ''}", host=addr)
        chan.exec_command(to_bytes(cmd, errors="surrogate_or_strict"))

        # Input is sent, and stderr read, while stdout is read: a command that writes much
        # before it has read all its input (or fills stderr first) cannot block the other side.
        send_error: list[Exception] = []

        def send() -> None:
            try:
                if in_data:
                    chan.sendall(in_data)  # send() may take only part of it
                chan.shutdown_write()
            except Exception as err:  # the command ended first: its status tells why
                send_error.append(err)

        stderr: list[bytes] = []
        workers = [threading.Thread(target=lambda: stderr.append(_drain(chan.recv_stderr)))]
        if in_data is not None:
            workers.append(threading.Thread(target=send))
        for worker in workers:
            worker.daemon = True
            worker.start()
        stdout = _drain(chan.recv)
        for worker in workers:
            worker.join()
        rc = chan.recv_exit_status()
        chan.close()
        err = b"".join(stderr)
        self._check_pct(rc, err)
        if send_error and rc == 0:
            raise AnsibleConnectionFailure(
                f"{len(in_data or b'')} bytes for the input of {cmd!r} on {addr} were not all "
                f"sent: {send_error[0]}"
            )
        return rc, stdout, err

    def _check_pct(self, rc: int, err: bytes) -> None:
        """`pct` missing on the node, or `pct exec` refused before the command ran
        (CLI/pct.pm `exec`): the container's config is not on this node (migrated, or
        removed), or it does not run. Said as the host being unreachable, with where to look,
        instead of a module failure."""
        vmid, addr = self.get_option("vmid"), to_text(self.get_option("remote_addr"))
        if b"pct: not found" in err:
            raise AnsibleError(f"pct not found in the PATH of the node {addr}")
        text = to_text(err).strip()
        if rc == 2 and f"lxc/{vmid}.conf' does not exist" in text:
            raise AnsibleConnectionFailure(
                f"container {vmid} is not on the Proxmox node at {addr} ({text}): it was "
                "migrated to another node, or removed. `pvesh get /cluster/resources --type vm` "
                "on any node of the cluster says where it is; set proxmox_node and ansible_host "
                "to that node"
            )
        if rc != 0 and f"container '{vmid}' not running!" in text:
            raise AnsibleConnectionFailure(
                f"container {vmid} on the Proxmox node at {addr} does not run ({text}): start "
                f"it (pct start {vmid}), or let the deploy start it "
                "(dflash_proxmox_start_if_stopped: true)"
            )

    def put_file(self, in_path: str, out_path: str) -> None:
        """Copy a local file into the container: `cat > PATH` with the file on stdin."""
        display.vvv(f"PUT {in_path} TO {out_path}", host=self.get_option("remote_addr"))
        try:
            with open(in_path, "rb") as source:
                data = source.read()
        except OSError as err:
            raise AnsibleError(f"cannot read {in_path} to put it to {out_path}: {err}") from err
        self._cat(f"cat > {self._shell.quote(out_path)}", data, f"put {in_path} to {out_path}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        """Copy a file of the container to the controller: `cat PATH`, read from stdout."""
        display.vvv(f"FETCH {in_path} TO {out_path}", host=self.get_option("remote_addr"))
        data = self._cat(f"cat {self._shell.quote(in_path)}", None, f"fetch {in_path}")
        try:
            with open(out_path, "wb") as target:
                target.write(data)
        except OSError as err:
            raise AnsibleError(f"cannot write {out_path} fetched from {in_path}: {err}") from err

    def _cat(self, script: str, data: bytes | None, what: str) -> bytes:
        cmd = f"{self._shell.executable} -c {self._shell.quote(script)}"
        rc, stdout, stderr = self.exec_command(cmd, in_data=data, sudoable=False)
        if rc != 0:
            raise AnsibleError(
                f"cannot {what} in container {self.get_option('vmid')} on "
                f"{self.get_option('remote_addr')} (exit {rc}): {to_text(stderr).strip()}"
            )
        return stdout
