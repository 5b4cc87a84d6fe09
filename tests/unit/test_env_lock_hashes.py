"""Hashes in a target's environment lock (module_utils/dflash_env_lock.py) and the lock
`make env-lock` makes from uv's resolution (library/dflash_env_resolve.py), with uv resolving
for real from a folder of wheels (no index)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    lock_id,
    lock_problems,
    matches,
    requirement_lines,
    unhashed,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_installer import (
    UV_VERSION,
    install_command,
)
from tests.helpers import REPO, build_wheel, local_env_lock

sys.path.insert(0, str(REPO / "library"))
import dflash_env_resolve

SHA = "a" * 64
LOCK = {
    "python": "3.11",
    "torch": "2.13.0+cpu",
    "wheels": {"numpy": "2.4.6"},
    "sha256": {"torch": SHA, "numpy": ["b" * 64, "c" * 64]},
    "source": {"wheelhouse": "/w"},
}


def test_a_lock_with_every_hash_passes_and_its_pins_carry_them():
    assert lock_problems(LOCK) == []
    assert requirement_lines(LOCK) == [
        f"numpy==2.4.6 --hash=sha256:{'b' * 64} --hash=sha256:{'c' * 64}",
        f"torch==2.13.0+cpu --hash=sha256:{SHA}",
    ]


def test_a_pin_without_a_hash_is_refused_naming_it_and_both_fixes():
    lock = {**LOCK, "sha256": {"torch": SHA}}
    [problem] = lock_problems(lock)
    assert "pins 1 wheel(s) without a sha256 (numpy)" in problem
    assert "make env-lock SPEC=" in problem and "dflash_env_lock_unhashed: true" in problem
    assert lock_problems(lock, unhashed_ok=True) == []
    # Hashes go on every line or none (pip's rule): a partly hashed lock installs unhashed.
    assert requirement_lines(lock) == ["numpy==2.4.6", "torch==2.13.0+cpu"]


def test_an_adopted_interpreter_needs_no_hashes_and_bad_hashes_are_named():
    adopted = {"python": "3.11", "torch": "2.13.0+cpu", "source": {"python": "/opt/py/bin/python3"}}
    assert unhashed(adopted) == [] and lock_problems(adopted) == []
    bad = {**LOCK, "sha256": {**LOCK["sha256"], "numpy": ["not-hex"]}}
    assert any("sha256 of 'numpy' is not a hex sha256" in p for p in lock_problems(bad))


def test_a_pin_without_a_local_label_is_met_by_that_build_of_it():
    """PyPI's torch 2.11.0 reports 2.11.0+cu130 (PEP 440's == matches any local label); a pin
    with a label is met by that label only: +cu128 is not +cu130."""
    assert matches("2.11.0", "2.11.0+cu130") and matches("2.11.0+cu130", "2.11.0+cu130")
    assert not matches("2.11.0+cu128", "2.11.0+cu130") and not matches("2.11.0", "2.11.1")
    assert not matches("2.11.0", None) and matches(None, None)


def test_the_demo_lock_is_whole_and_hashed():
    """inventory/env-locks/cpu.yml, as make env-lock wrote it: every pin hashed, valid."""
    lock = local_env_lock()
    assert lock_problems(lock) == [] and unhashed(lock) == []
    assert lock["torch"].endswith("+cpu") and lock_id(lock).startswith("lock-")


@pytest.fixture(scope="module")
def uv() -> str:
    found = REPO / ".build" / "uv" / "bin" / "uv"
    if not found.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(found.parent.parent),
             "uv==" + uv_version()],
            check=True,
        )  # fmt: skip
    return str(found)


def uv_version() -> str:
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("UV_VERSION :="):
            return line.split(":=")[1].strip()
    raise AssertionError("no UV_VERSION in the Makefile")


def test_a_spec_resolves_into_a_lock_with_each_files_hash(uv, tmp_path):
    """uv resolves the closure from a folder of wheels for the spec's platform: every pin and
    the sha256 of its file, torch apart; a second resolution changes nothing."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    torch = build_wheel(folder, "torch", "2.13.0+cpu")
    spec = {"python": "3.11", "platform": "x86_64-manylinux_2_28", "torch": "2.13.0+cpu",
            "triton": None, "cuda": None, "index_url": "file:///nonexistent",
            "find_links": [str(folder)]}  # fmt: skip
    lock = dflash_env_resolve.resolve(spec, uv, [])
    assert lock["torch"] == "2.13.0+cpu" and lock["wheels"] == {}
    assert lock["sha256"] == {"torch": hashlib.sha256(torch.read_bytes()).hexdigest()}
    assert dflash_env_resolve.changes(lock, dflash_env_resolve.resolve(spec, uv, [])) == []
    text = dflash_env_resolve.render(lock, "x.in.yml")
    assert yaml.safe_load(text) == lock and text.startswith("# Made by `make env-lock`")


def test_a_spec_the_index_cannot_meet_is_named(uv, tmp_path):
    spec = {"python": "3.11", "platform": "x86_64-manylinux_2_28", "torch": "9.9.9",
            "index_url": "file:///nonexistent", "find_links": [str(tmp_path)]}  # fmt: skip
    with pytest.raises(dflash_env_resolve.SpecError, match="uv could not resolve the spec"):
        dflash_env_resolve.resolve(spec, uv, [])
    assert dflash_env_resolve.spec_problems({**spec, "platform": "linux", "extra": 1}) == [
        "the spec has 'extra', which is not one of ['cuda', 'extra_index_url', 'find_links', "
        "'index_url', 'platform', 'python', 'requires', 'torch', 'triton']",
        "the spec's platform 'linux' is not a uv platform; write the target's, e.g. "
        "x86_64-manylinux_2_28 (glibc 2.28 or newer on x86_64)",
    ]


def test_changes_name_each_pin_and_a_change_of_files_alone():
    before = {"torch": "2.13.0+cpu", "wheels": {"numpy": "2.4.5"}, "sha256": {"torch": SHA}}
    after = {"torch": "2.13.0+cpu", "wheels": {"numpy": "2.4.6", "rich": "15.0.0"},
             "sha256": {"torch": SHA}}  # fmt: skip
    assert dflash_env_resolve.changes(before, after) == [
        "numpy 2.4.5 -> 2.4.6",
        "rich (none) -> 15.0.0",
    ]
    moved = {**before, "sha256": {"torch": "d" * 64}}
    assert dflash_env_resolve.changes(before, moved) == [
        "the same versions, other files (their hashes changed)"
    ]


def uv_wheel(folder: Path, script: str) -> Path:
    """A wheel laid out as uv's (its binary under uv-<v>.data/scripts/), holding `script`."""
    path = folder / f"uv-{UV_VERSION}-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"uv-{UV_VERSION}.data/scripts/uv", script)
    return path


def test_the_build_installs_with_uv_from_its_wheel_where_it_runs_else_with_pip(tmp_path):
    wheelhouse, work = tmp_path / "wheelhouse", tmp_path / "work"
    wheelhouse.mkdir()
    work.mkdir()
    lock = {**LOCK, "source": {"wheelhouse": str(wheelhouse)}}
    pip = wheelhouse / "pip-26.3-py3-none-any.whl"
    pip.touch()
    runs = uv_wheel(wheelhouse, f"#!/bin/sh\necho uv {UV_VERSION}\n")
    files = {("pip", "26.3"): str(pip), ("uv", UV_VERSION): str(runs)}
    cmd, env, what = install_command(lock, "/env/bin/python", files, str(work))
    assert cmd[:3] == [str(work / "uv"), "pip", "install"] and what.startswith("uv pip")
    assert {"--require-hashes", "--no-deps", "--no-config", "--compile-bytecode"} <= set(cmd)
    assert cmd[cmd.index("--find-links") + 1] == str(wheelhouse) and "--no-index" in cmd
    assert not any(key.startswith("UV_") for key in env)
    # A uv that does not run here (another CPU's binary): pip from its wheel installs.
    broken = uv_wheel(tmp_path, "\x7fELF not for this machine")
    files[("uv", UV_VERSION)] = str(broken)
    cmd, env, what = install_command(lock, "/env/bin/python", files, str(work))
    assert cmd[:2] == ["/env/bin/python", str(pip / "pip")] and what.startswith("pip install")
    assert "--require-hashes" in cmd and env["PIP_CONFIG_FILE"] == os.devnull


def test_the_targets_uv_is_the_controllers():
    """The wheelhouse carries the uv `make lock` and `make env-lock` run (the Makefile's)."""
    assert uv_version() == UV_VERSION
