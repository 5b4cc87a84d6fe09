"""The advice for an untrusted Proxmox API certificate names the certificate a real TLS server
serves and the CA file that validates it, for the kinds a node can serve: Proxmox's own (the
test bed's, tests/proxmox/test_dflash_proxmox.py), a self-signed pveproxy-ssl.pem, and one
issued by another CA (custom or ACME). Certificates made with openssl, served by Python's ssl."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import certificate_advice


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "self.pem", folder / "self.key"
    openssl("req", "-x509", *EC, "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", "/CN=pve1.example.org")  # fmt: skip
    return cert, key


def issued_by_other_ca(folder: Path) -> tuple[Path, Path]:
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    openssl("req", "-x509", *EC, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
            "-subj", "/C=US/O=Let's Encrypt/CN=R11")  # fmt: skip
    key, csr, cert = folder / "node.key", folder / "node.csr", folder / "node.pem"
    openssl("req", *EC, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=pve1.example.org")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "2")  # fmt: skip
    return cert, key


@contextmanager
def serving(cert: Path, key: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 that completes handshakes with this certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def advice_for(make: Callable[[Path], tuple[Path, Path]], folder: Path) -> str:
    with serving(*make(folder)) as port:
        return certificate_advice("127.0.0.1", port)


def test_a_self_signed_certificate_is_trusted_by_itself(tmp_path: Path) -> None:
    advice = advice_for(self_signed, tmp_path)
    assert advice.startswith(
        "it serves subject CN=pve1.example.org, issued by CN=pve1.example.org: a self-signed "
        "certificate (a custom /etc/pve/nodes/<node>/pveproxy-ssl.pem): set "
        "proxmox_api_ca_file to a copy of that certificate itself"
    ), advice
    assert "pve-root-ca" not in advice


def test_a_certificate_of_another_ca_names_that_ca_not_pve_root_ca(tmp_path: Path) -> None:
    advice = advice_for(issued_by_other_ca, tmp_path)
    assert advice.startswith(
        "it serves subject CN=pve1.example.org, issued by CN=R11,O=Let's Encrypt,C=US: a custom "
        "or ACME certificate (/etc/pve/nodes/<node>/pveproxy-ssl.pem), which pve-root-ca.pem "
        "does not validate: set proxmox_api_ca_file to the chain of CN=R11,O=Let's Encrypt,C=US"
    ), advice


def test_a_server_that_went_away_still_gets_the_general_advice() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    advice = certificate_advice("127.0.0.1", port)
    assert advice.startswith("(the certificate it serves could not be read: ")
    assert "pve-root-ca.pem" in advice and "pveproxy-ssl.pem" in advice
