"""The changelog (docs/development.md "The changelog"): every fragment is valid, CHANGELOG.md is
what antsibull-changelog makes of changelogs/, and pyproject.toml's version is the newest
release, or the one its unreleased fragments will be."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.version import Version

from tests.helpers import REPO

TOOL = Path(sys.executable).with_name("antsibull-changelog")


def test_every_fragment_is_valid():
    out = subprocess.run([TOOL, "lint"], cwd=REPO, capture_output=True, text=True, check=False)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_changelog_md_is_made_from_the_fragments(tmp_path: Path):
    shutil.copytree(REPO / "changelogs", tmp_path / "changelogs")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    subprocess.run([TOOL, "generate"], cwd=tmp_path, capture_output=True, check=True)
    assert (tmp_path / "CHANGELOG.md").read_text() == (REPO / "CHANGELOG.md").read_text(), (
        "CHANGELOG.md is out of date: run .venv/bin/antsibull-changelog generate"
    )


def test_the_version_is_the_newest_release_or_the_next_one():
    version = Version(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])
    releases = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    newest = max(Version(name) for name in releases)
    pending = [p for p in (REPO / "changelogs" / "fragments").glob("*.y*ml")]
    if pending:
        assert version > newest, (
            f"fragments wait for a release, so pyproject.toml's version {version} must be the "
            f"next one, above {newest}"
        )
    else:
        assert version == newest, f"pyproject.toml says {version}, the changelog {newest}"
