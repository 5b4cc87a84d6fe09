"""Installed versions as the lock compares them (module_utils/dflash_env_lock.py): from dist-info,
and torch's with the build suffix torch itself records where an image's dist-info drops it
(seen on the GPU machine: dist-info 2.11.0, torch.__version__ 2.11.0+cu130)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    installed_versions,
    version_drift,
)


def site(env: Path, torch_dist: str, torch_file: str | None) -> Path:
    folder = env / "lib" / "python3.12" / "site-packages"
    (folder / f"torch-{torch_dist}.dist-info").mkdir(parents=True)
    (folder / f"torch-{torch_dist}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_dist}\n\n"
    )
    if torch_file is not None:
        (folder / "torch").mkdir()
        (folder / "torch" / "version.py").write_text(
            f"__all__ = ['__version__']\n__version__ = '{torch_file}'\ncuda = '13.0'\n"
        )
    return folder


def test_torch_keeps_the_build_suffix_its_own_version_file_records(tmp_path: Path):
    site(tmp_path / "a", "2.11.0", "2.11.0+cu130")
    assert installed_versions(str(tmp_path / "a")) == {"torch": "2.11.0+cu130"}
    lock = {"torch": "2.11.0+cu130"}
    assert version_drift(lock, installed_versions(str(tmp_path / "a"))) == []
    # Another build of the same release is drift, suffix included.
    site(tmp_path / "b", "2.11.0", "2.11.0+cu128")
    [drift] = version_drift(lock, installed_versions(str(tmp_path / "b")))
    assert (drift["expected"], drift["found"]) == ("2.11.0+cu130", "2.11.0+cu128")


def test_without_a_version_file_or_for_another_release_dist_info_rules(tmp_path: Path):
    site(tmp_path / "a", "2.11.0", None)
    assert installed_versions(str(tmp_path / "a")) == {"torch": "2.11.0"}
    # A version file of another release than the dist-info is not believed.
    site(tmp_path / "b", "2.11.0", "2.12.0+cu130")
    assert installed_versions(str(tmp_path / "b")) == {"torch": "2.11.0"}
