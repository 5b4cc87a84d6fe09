"""The node's TLS files, made with openssl as `pvecm updatecerts` lays them out: the cluster CA
(`/etc/pve/pve-root-ca.pem`, key in `priv/pve-root-ca.key`) and the node certificate signed by it
(`nodes/<node>/pve-ssl.pem` + `.key`) for 127.0.0.1 and localhost. Tests trust the CA file."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(etc_pve: Path, node: str) -> Path:
    """Write the CA and the node certificate; return the CA file (what a client trusts)."""
    priv, node_dir = etc_pve / "priv", etc_pve / "nodes" / node
    priv.mkdir(parents=True, exist_ok=True)
    node_dir.mkdir(parents=True, exist_ok=True)
    ca, ca_key = etc_pve / "pve-root-ca.pem", priv / "pve-root-ca.key"
    key, csr, cert = node_dir / "pve-ssl.key", node_dir / "pve-ssl.csr", node_dir / "pve-ssl.pem"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "3650",
             "-subj", "/CN=Proxmox Virtual Environment/O=PVE Cluster Manager CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr),
             "-subj", f"/OU=PVE Cluster Node/O=Proxmox Virtual Environment/CN={node}")  # fmt: skip
    extensions = node_dir / "pve-ssl.ext"
    extensions.write_text(
        f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{node}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "365",
             "-extfile", str(extensions))  # fmt: skip
    for path in (ca_key, key):
        path.chmod(0o600)
    return ca
