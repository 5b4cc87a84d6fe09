# The environment lock (inventory data): its validation, its id, and matching wheels to it.
# Shared by the controller (preflight, wheelhouse) and the target-side environment module.
from __future__ import annotations

import glob
import hashlib
import json
import os
import re

# PEP 440 release with optional pre/post/dev parts and a local suffix (+cu128, +cpu).
_VERSION_RE = re.compile(
    r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$"
)
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PYTHON_RE = re.compile(r"^3\.\d+(\.\d+)?$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def normalize(name: str) -> str:
    """PEP 503 project name normalisation (dist-info and wheel names differ in case and -/_)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lock: dict) -> dict[str, str]:
    """Every locked wheel as {normalised name: version}: torch, triton and the rest."""
    pins = {normalize(name): str(version) for name, version in (lock.get("wheels") or {}).items()}
    for key in ("torch", "triton"):
        if lock.get(key):
            pins[key] = str(lock[key])
    return pins


def lock_problems(lock: object) -> list[str]:
    """Everything wrong with a lock, each naming the value and the fix; [] when it is valid."""
    if not isinstance(lock, dict):
        return [f"dflash_lock must be a mapping (python, torch, wheels, source), got {lock!r}"]
    problems = []
    python = str(lock.get("python", ""))
    if not _PYTHON_RE.match(python):
        problems.append(
            f"dflash_lock.python '{python}' is not a Python version; write e.g. '3.11' or '3.11.2'"
        )
    names = dict((lock.get("wheels") or {}).items())
    names.update({key: lock[key] for key in ("torch", "triton") if lock.get(key)})
    for name, version in names.items():
        if not _NAME_RE.match(str(name)):
            problems.append(f"dflash_lock wheel name '{name}' is not a package name")
        if not _VERSION_RE.match(str(version)):
            problems.append(
                f"dflash_lock pins {name}=='{version}', which is not a version; write it as "
                "pip prints it, e.g. 2.11.0+cu128"
            )
    source = lock.get("source") or {}
    if bool(source.get("wheelhouse")) == bool(source.get("index_url")):
        problems.append(
            "dflash_lock.source needs exactly one of wheelhouse (a folder inside the target) "
            "or index_url"
        )
    pins = {normalize(str(n)) for n in names}
    for name, digest in (lock.get("sha256") or {}).items():
        if normalize(name) not in pins:
            problems.append(f"dflash_lock.sha256 names '{name}', which the lock does not pin")
        if not _SHA_RE.match(str(digest)):
            problems.append(f"dflash_lock.sha256 of '{name}' is not a hex sha256")
    return problems


def lock_id(lock: dict) -> str:
    """Folder name of the env built from this lock: any change to what it pins is a new env.

    The source is left out: the same pins (and hashes) from a moved wheelhouse are the same env.
    """
    content = {key: value for key, value in lock.items() if key != "source"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return "lock-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    """(normalised name, version) from a wheel file name, or None for other files."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return None
    # Wheel file names escape '+' in local versions as is; '_' stands for '-' in names.
    return normalize(parts[0]), parts[1]


def requirement_lines(lock: dict) -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(pinned(lock).items())]


def installed_versions(env_dir: str) -> dict[str, str]:
    """Versions from dist-info metadata: no import, so it is fast and trusts nothing in the env."""
    found = {}
    pattern = os.path.join(env_dir, "lib", "python3*", "site-packages", "*.dist-info", "METADATA")
    for metadata in glob.glob(pattern):
        name = version = None
        with open(metadata, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                if (name and version) or not line.strip():
                    break
        if name and version:
            found[normalize(name)] = version
    return found


def version_drift(lock: dict, installed: dict[str, str]) -> list[dict]:
    drift = []
    pins = pinned(lock)
    for name in sorted(set(pins) | set(installed)):
        if pins.get(name) != installed.get(name):
            drift.append(
                {"package": name, "expected": pins.get(name), "found": installed.get(name)}
            )
    return drift
