# Shared by the controller-side build module and the target-side modules: the release naming
# rules, the MANIFEST.json tree hash, the reproducible archive format (docs/deploy.md, state.md).
# The trainer computes the same tree hash in dflash/codehash.py; tests/unit keeps the two equal.
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile

MANIFEST_NAME = "MANIFEST.json"
PACKAGE_DIR = "dflash"
# A release id becomes a folder name on the target and a tag name on the controller.
_RELEASE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def release_id_problem(name: str) -> str | None:
    """Why `name` cannot be a release id, or None when it can."""
    if not name:
        return "it is empty"
    if "/" in name:
        return "it contains '/'"
    if ".." in name:
        return "it contains '..'"
    if any(ch.isspace() for ch in name):
        return "it contains whitespace"
    if not _RELEASE_ID_RE.match(name):
        return "only letters, digits and . _ + - are allowed, starting with a letter or digit"
    return None


def is_ignored_path(rel_path: str) -> bool:
    """Bytecode caches are written by Python next to the code; they are not part of a release."""
    parts = rel_path.split("/")
    return "__pycache__" in parts or rel_path.endswith((".pyc", ".pyo"))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(files: dict[str, str]) -> str:
    """sha256 over the sorted lines `path\\0sha256\\n` (docs/state.md)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path]}\n".encode())
    return digest.hexdigest()


def build_archive(contents: dict[str, tuple[bytes, int]], manifest: dict, mtime: int) -> bytes:
    """A byte-for-byte reproducible .tar.gz of `contents` ({path: (bytes, mode)}) + MANIFEST.json.

    Sorted members, fixed owner, mode and mtime, and a gzip header without name or time, so the
    same tree always gives the same archive.
    """
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        entries = dict(contents)
        entries[MANIFEST_NAME] = (manifest_bytes(manifest), 0o644)
        for path in sorted(entries):
            data, mode = entries[path]
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o755 if mode & 0o111 else 0o644
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def file_drift(folder: str, manifest: dict) -> dict:
    """Files of a release folder against its manifest: changed, missing and extra paths."""
    expected: dict = manifest.get("files", {})
    changed, missing = [], []
    for rel, sha in sorted(expected.items()):
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            missing.append(rel)
        elif sha256_file(path) != sha:
            changed.append(rel)
    on_disk = set()
    for parent, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            rel = os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
            if rel != MANIFEST_NAME and not is_ignored_path(rel):
                on_disk.add(rel)
    extra = sorted(on_disk - set(expected))
    return {"changed": changed, "missing": missing, "extra": extra}
