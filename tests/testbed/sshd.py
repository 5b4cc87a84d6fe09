"""The node's SSH server: a second sshd on 127.0.0.1, alone in its own mount namespace.

Proxmox's `pct` is /usr/sbin/pct and `pvesh` is /usr/bin/pvesh, and the connection plugin runs the
absolute path. So sshd runs under `unshare --mount --propagation private`, where /usr/sbin and
/usr/bin are read-only overlays with the shim folders on top: every session sees the doubles,
the host's own /usr is untouched, and the overlays vanish with the namespace when sshd ends.

The node's root also gets Debian's stock ~/.bashrc and ~/.profile there (bind mounts over the
files): bash sources ~/.bashrc for SSH commands, and a controller's (pyenv init and the like)
would add ~0.15 s to every `pct exec` and put the controller's PATH on the node.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .procs import ProcRef

SSHD = "/usr/sbin/sshd"

_NAMESPACE_SCRIPT = """set -e
mount -t overlay dflash-testbed-sbin -o "lowerdir=$1:/usr/sbin" /usr/sbin
mount -t overlay dflash-testbed-bin -o "lowerdir=$2:/usr/bin" /usr/bin
for rc in .bashrc .profile; do
  if [ -e "/root/$rc" ]; then mount --bind "$4/$rc" "/root/$rc"; fi
done
exec /usr/sbin/sshd -D -e -f "$3"
"""


@dataclass(frozen=True)
class SshEndpoint:
    host: str
    port: int
    user: str
    private_key: Path
    known_hosts: Path


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(folder: Path, port: int) -> str:
    return f"""# sshd of the dflash test bed (a Proxmox-like node on loopback)
Port {port}
ListenAddress 127.0.0.1
HostKey {folder / "ssh_host_ed25519_key"}
PidFile {folder / "sshd.pid"}
AuthorizedKeysFile {folder / "authorized_keys"}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# No PAM: the session environment stays minimal and predictable.
UsePAM no
# The folder lives under the world-writable /tmp.
StrictModes no
# Ansible forks open many sessions at once.
MaxSessions 100
MaxStartups 100:30:200
PrintMotd no
Subsystem sftp internal-sftp
"""


def prepare_keys(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _keygen(folder / "ssh_host_ed25519_key", "dflash-testbed-host")
    _keygen(folder / "client_ed25519", "dflash-testbed-client")
    (folder / "authorized_keys").write_text((folder / "client_ed25519.pub").read_text())
    (folder / "client_ed25519").chmod(0o600)


def _wait_for_banner(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def _node_home(folder: Path) -> Path:
    """Shell start-up files for the node's root, from /etc/skel as on a freshly installed node."""
    home = folder / "node-home"
    home.mkdir(mode=0o700, exist_ok=True)
    for name in (".bashrc", ".profile"):
        skel = Path("/etc/skel") / name
        (home / name).write_text(skel.read_text() if skel.exists() else "")
    return home


def start_sshd(folder: Path, shim_sbin: Path, shim_bin: Path) -> tuple[ProcRef, SshEndpoint]:
    """Start sshd in its own mount namespace; retry on another port if the chosen one is taken."""
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    home = _node_home(folder)
    last_log = ""
    for _attempt in range(3):
        port = free_port()
        (folder / "sshd_config").write_text(_config(folder, port))
        log = (folder / "sshd.log").open("ab")
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
             _NAMESPACE_SCRIPT, "sh", str(shim_sbin), str(shim_bin), str(folder / "sshd_config"),
             str(home)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,  # a Ctrl-C on the terminal must not kill it before teardown
        )  # fmt: skip
        log.close()
        if _wait_for_banner(port, proc, timeout_s=10):
            host_key = (folder / "ssh_host_ed25519_key.pub").read_text().split()
            known_hosts = folder / "known_hosts"
            known_hosts.write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
            endpoint = SshEndpoint(
                "127.0.0.1", port, "root", folder / "client_ed25519", known_hosts
            )
            return ProcRef.of(proc.pid, "sshd (node namespace)"), endpoint
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        last_log = (folder / "sshd.log").read_text(errors="replace")[-1500:]
    raise RuntimeError(f"sshd of the test bed did not come up; its log ends with:\n{last_log}")
