"""The code tree hash: the same definition as the toolkit's MANIFEST.json `tree_sha256`.

Stdlib only, so that the toolkit could import it without torch.
Files: every regular file under the package folder, recursively, except `__pycache__` folders
and `.pyc`/`.pyo` files. Key: "dflash/" + the POSIX path relative to the package folder.
tree_sha256 = sha256 over the lines f"{key}\\0{sha256(bytes)}\\n", sorted by key, UTF-8.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE = "dflash"
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def file_hashes(package_dir: Path) -> dict[str, str]:
    """Map "dflash/<relative path>" to the hex sha256 of each file of the package."""
    package_dir = Path(package_dir)
    hashes: dict[str, str] = {}
    for path in package_dir.rglob("*"):
        relative = path.relative_to(package_dir)
        if "__pycache__" in relative.parts or path.name.endswith(_SKIPPED_SUFFIXES):
            continue
        if path.is_file() and not path.is_symlink():
            key = f"{PACKAGE}/{relative.as_posix()}"
            hashes[key] = sha256_file(path)
    return hashes


def sha256_file(path: Path) -> str:
    """The hex sha256 of one file, read in 1 MiB blocks (an export's weights, a compiled kernel)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_sha256(files: dict[str, str]) -> str:
    """The hash of a whole tree from its per-file hashes."""
    lines = "".join(f"{key}\0{files[key]}\n" for key in sorted(files))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
