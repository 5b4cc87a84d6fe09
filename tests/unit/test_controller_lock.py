"""The controller is pinned as exactly as the targets: requirements.lock (made by `make lock`
from pyproject.toml) names one version and its hashes for every package, it satisfies every
requirement of pyproject.toml, and the venv `make venv` built holds exactly those versions."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def locked() -> dict[str, tuple[Version, list[str]]]:
    """Every pin of the lock: its version and the hashes given for it."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    name = ""
    for line in LOCK.read_text().splitlines():
        if match := PIN.match(line):
            name = canonicalize_name(match[1])
            pins[name] = (Version(match[2]), [])
        elif line.strip().startswith("--hash=sha256:"):
            pins[name][1].append(line.strip().removeprefix("--hash=sha256:").rstrip(" \\"))
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"requirements.lock: a line that is no pin or hash: {line!r}")
    return pins


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["trainer"], *extras["dev"]]]


def test_every_pin_is_exact_and_hashed():
    pins = locked()
    assert len(pins) > 50, "the lock holds the whole closure, not only the direct requirements"
    unhashed = sorted(name for name, (_, hashes) in pins.items() if not hashes)
    assert not unhashed, f"pins without a sha256 (run `make lock`): {unhashed}"
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for _, hashes in pins.values() for h in hashes)


def test_the_lock_satisfies_pyproject():
    pins = locked()
    unmet = []
    for requirement in project_requirements():
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None or not requirement.specifier.contains(pin[0], prereleases=True):
            unmet.append(f"{requirement} (locked: {pin[0] if pin else 'absent'})")
    assert not unmet, f"pyproject.toml asks for what the lock lacks (run `make lock`): {unmet}"
    # torch's CPU build, the one these machines carry (a plain torch==2.13.0 is a CUDA build).
    assert str(pins["torch"][0]).endswith("+cpu")


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (REPO / ".venv").resolve(),
    reason="runs in the venv `make venv` built (.venv), which this interpreter is not",
)
def test_the_venv_holds_exactly_the_locked_versions():
    drift = []
    for name, (version, _) in locked().items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            drift.append(f"{name}: locked {version}, not installed")
            continue
        if installed != version:
            drift.append(f"{name}: locked {version}, installed {installed}")
    assert not drift, f"the venv is not the lock's (run `make venv`): {drift}"


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (REPO / ".venv").resolve(),
    reason="runs in the venv `make venv` built (.venv), which this interpreter is not",
)
def test_the_venv_carries_its_bytecode():
    """uv compiles nothing unless told: every playbook run would compile ansible-core anew
    where PYTHONDONTWRITEBYTECODE is set (as on this project's machines)."""
    import ansible

    package = Path(ansible.__file__).parent
    sources = {p.stem for p in package.glob("*.py")}
    compiled = {p.name.split(".")[0] for p in (package / "__pycache__").glob("*.pyc")}
    assert sources <= compiled, f"no bytecode in {package} for {sorted(sources - compiled)}"
