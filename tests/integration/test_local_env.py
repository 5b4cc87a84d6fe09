"""The environment lock on the local target: new lock -> new env, drift found by name and
version, bad locks refused before any env changes. Small self-built wheels keep it fast."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import PKG, small_lock


def envs_of(root: Path) -> dict[str, str]:
    """{env folder: installed probe version} read from each env's dist-info."""
    found = {}
    for env in sorted((root / "envs").iterdir()):
        metas = list(env.glob("lib/python3*/site-packages/dflashtest_probe-*.dist-info"))
        found[env.name] = metas[0].name.removesuffix(".dist-info").split("-")[1] if metas else None
    return found


@pytest.fixture
def deploy(source_repo, playbook):
    repo = source_repo("v1", {"dflash/__init__.py": "VERSION = 1\n"})

    def run(lock: dict, **extravars):
        return playbook(
            "deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1", dflash_env_lock=lock,
            **extravars,
        )  # fmt: skip

    return run


def test_new_lock_makes_new_env_and_keeps_the_old(deploy, wheelhouse, target_root):
    first = deploy(small_lock(wheelhouse, "1.0"))
    assert first.rc == 0, first.output
    envs_before = envs_of(target_root)
    again = deploy(small_lock(wheelhouse, "1.0"))
    assert again.rc == 0 and again.changed() == 0, again.output

    # --check --diff of the new lock: the env it would build, against the pins of the env the
    # current deployment uses; nothing changes.
    [old_env] = envs_before
    state = {p: p.read_bytes() for p in (target_root / "run.sh", target_root / "history.jsonl")}
    dry = deploy(small_lock(wheelhouse, "1.1"), _check=True)
    assert dry.rc == 0 and dry.changed() > 0, dry.output
    built = re.search(r"^\+\+\+ after: (\S+)/envs/(lock-\w+) \(to be built\)$", dry.output, re.M)
    assert built and built[1] == str(target_root), dry.output
    named = built[2]
    assert f"--- before: {target_root}/envs/{old_env} (current deployment)" in dry.output
    assert f"-{PKG}==1.0\n+{PKG}==1.1\n" in dry.output
    # Also without --diff: the env and the version that changes are named.
    flat = " ".join(dry.output.split())
    assert f"envs/{named} would be built next to envs/{old_env}" in flat
    assert f"{PKG} 1.0 -> 1.1" in flat
    assert envs_of(target_root) == envs_before
    assert {p: p.read_bytes() for p in state} == state

    second = deploy(small_lock(wheelhouse, "1.1"))
    assert second.rc == 0, second.output
    envs_after = envs_of(target_root)
    # The env check mode named is the one the deploy built.
    assert set(envs_after) - set(envs_before) == {named} and envs_after[named] == "1.1"
    for name, version in envs_before.items():
        assert envs_after[name] == version, "an existing env was touched"
    assert "1.0" in envs_before.values()


def test_hand_changed_package_is_named_and_rebuilt(deploy, wheelhouse, target_root):
    lock = small_lock(wheelhouse, "1.0")
    assert deploy(lock).rc == 0
    [env] = [name for name, version in envs_of(target_root).items() if version == "1.0"]
    env_python = target_root / "envs" / env / "bin" / "python"
    pip = next(wheelhouse.glob("pip-*.whl"))
    subprocess.run(
        [
            str(env_python),
            f"{pip}/pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--find-links",
            str(wheelhouse),
            f"{PKG}==1.1",
        ],
        check=True,
        env=dict(os.environ, PIP_CONFIG_FILE=os.devnull),
    )
    assert envs_of(target_root)[env] == "1.1"

    # --check --diff: the env as installed against its lock; nothing is rebuilt.
    dry = deploy(lock, _check=True)
    assert dry.rc == 0 and dry.changed() > 0, dry.output
    env_dir = target_root / "envs" / env
    assert f"--- before: {env_dir} (as installed)" in dry.output
    assert f"+++ after: {env_dir} (the lock)" in dry.output
    assert f"-{PKG}==1.1\n+{PKG}==1.0\n" in dry.output
    assert f"{PKG} 1.1 -> 1.0): would be built again" in " ".join(dry.output.split())
    assert envs_of(target_root)[env] == "1.1"

    run = deploy(lock)
    assert run.rc == 0, run.output
    assert PKG in run.output and "'expected': '1.0'" in run.output.replace('"', "'")
    assert "'found': '1.1'" in run.output.replace('"', "'")
    assert envs_of(target_root)[env] == "1.0"

    # The current deployment's env folder deleted: rebuilt where it was, and said so (not "next
    # to" itself, as if it were another env).
    shutil.rmtree(env_dir)
    rebuilt = deploy(lock)
    assert rebuilt.rc == 0, rebuilt.output
    flat = " ".join(rebuilt.output.split())
    assert f"envs/{env} of the current deployment was missing: built again in its place" in flat
    assert "next to" not in flat
    assert envs_of(target_root)[env] == "1.0"


def test_bad_locks_fail_before_any_env_changes(deploy, wheelhouse, target_root, tmp_path):
    assert deploy(small_lock(wheelhouse, "1.0")).rc == 0
    before = envs_of(target_root)
    current = os.readlink(target_root / "current")
    wheel = next(wheelhouse.glob("dflashtest_probe-1.0-*.whl"))
    wrong_sha = hashlib.sha256(b"not the wheel").hexdigest()
    cases = [
        (small_lock(wheelhouse, "2.0"), [f"{PKG}==2.0", "versions 1.0, 1.1"]),
        (small_lock(wheelhouse, "1.0-bad!"), ["'1.0-bad!'", "not a version"]),
        (dict(small_lock(wheelhouse), python="3.99"), ["Python 3.99", "install python3.99"]),
        (small_lock(wheelhouse, sha256={PKG: wrong_sha}), [wheel.name, wrong_sha]),
        (small_lock(tmp_path / "nowhere"), ["nowhere", "not a folder"]),
    ]
    for lock, expected in cases:
        run = deploy(lock)
        assert run.rc != 0, lock
        flat = " ".join(run.output.split())
        for text in expected:
            assert text in flat, (text, run.output)
        assert envs_of(target_root) == before
        assert os.readlink(target_root / "current") == current


def test_an_adopted_interpreter_is_checked_never_changed(deploy, playbook, wheelhouse, tmp_path):
    """source: {python: ...} adopts an interpreter as it is (an image's preinstalled torch):
    its pins are checked before any change and by verify later; nothing is installed into it."""
    venv = tmp_path / "image-venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = next(wheelhouse.glob("pip-*.whl"))

    def install(version: str) -> None:
        wheel = next(wheelhouse.glob(f"dflashtest_probe-{version}-*.whl"))
        subprocess.run(
            [str(venv / "bin" / "python"), f"{pip}/pip", "install", "-q", "--no-deps",
             "--no-index", "--force-reinstall", str(wheel)],
            check=True,
        )  # fmt: skip

    install("1.0")
    python = str(venv / "bin" / "python")
    lock = {"python": "3.11", "wheels": {PKG: "1.0"}, "source": {"python": python}}
    first = deploy(lock)
    assert first.rc == 0, first.output
    assert "adopted as it is, never changed" in " ".join(first.output.split())
    marker = next((tmp_path / "target" / "dflash" / "envs").glob("*/.dflash-env.json"))
    assert python in marker.read_text()
    assert python in (tmp_path / "target" / "dflash" / "run.sh").read_text()
    assert playbook("verify.yml").rc == 0

    # A lock the interpreter does not hold is refused before anything changes.
    refused = deploy(dict(lock, wheels={PKG: "1.1"}))
    assert refused.rc != 0
    assert f"{PKG} 1.0, the lock says 1.1" in " ".join(refused.output.split()), refused.output

    # Changed under the deployment: verify names it.
    install("1.1")
    drift = playbook("verify.yml")
    assert drift.rc != 0
    assert [(f["kind"], f.get("package")) for f in drift.report["hosts"]["local"]["findings"]] == [
        ("environment", PKG)
    ]
