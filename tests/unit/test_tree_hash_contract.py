"""MANIFEST.json's tree hash (module_utils, used by deploy) and the trainer's code_tree_sha256
(dflash/codehash.py, reported in status.json) are one definition: verify relies on it."""

from __future__ import annotations

import shutil

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import (
    sha256_file,
    tree_sha256,
)
from dflash import codehash
from tests.helpers import REPO


def test_trainer_and_manifest_hash_the_same_tree(tmp_path):
    package = tmp_path / "dflash"
    shutil.copytree(REPO / "dflash", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"ignored")
    manifest_files = {
        f"dflash/{p.relative_to(package).as_posix()}": sha256_file(str(p))
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    trainer_files = codehash.file_hashes(package)
    assert trainer_files == manifest_files
    assert codehash.tree_sha256(trainer_files) == tree_sha256(manifest_files)
