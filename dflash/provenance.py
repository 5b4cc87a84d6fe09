"""What code and environment this process runs: tree hash, release name, versions, log header."""

from __future__ import annotations

import functools
import json
import platform
from pathlib import Path

import torch

import dflash
from dflash.codehash import file_hashes, tree_sha256

PACKAGE_DIR = Path(dflash.__file__).resolve().parent
UNRELEASED = "unreleased"


@functools.cache
def code_tree_sha256() -> str:
    """Hash of the package this process imported; cached at the first call (process start)."""
    return tree_sha256(file_hashes(PACKAGE_DIR))


@functools.cache
def release_name() -> str:
    """The "release" of the MANIFEST.json beside the package, or "unreleased" without one."""
    manifest = PACKAGE_DIR.parent / "MANIFEST.json"
    if not manifest.exists():
        return UNRELEASED
    try:
        release = json.loads(manifest.read_text())["release"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{manifest}: not a valid release manifest ({exc!r})") from exc
    return str(release)


def versions() -> dict[str, str | None]:
    try:
        import triton  # optional: absent from CPU wheels

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
    }


def header_lines(run_id: str, roles: dict[str, list[int]], extra: dict[str, object]) -> list[str]:
    """The block that opens every train.log: what runs, from which code, where."""
    v = versions()
    gpus = {role: ",".join(map(str, ids)) or "cpu" for role, ids in roles.items()}
    lines = [
        "=== dflash trainer ===",
        f"run_id: {run_id}",
        f"release: {release_name()}",
        f"code_tree_sha256: {code_tree_sha256()}",
        f"package: {PACKAGE_DIR}",
        f"versions: python {v['python']} torch {v['torch']} triton {v['triton'] or 'none'} "
        f"cuda {v['cuda'] or 'none'}",
        f"gpus: target {gpus['target']} drafter {gpus['drafter']}",
    ]
    lines += [f"{key}: {value}" for key, value in extra.items()]
    lines.append("===")
    return lines
