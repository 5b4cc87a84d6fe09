"""The code tree hash equals the MANIFEST.json definition, also as the trainer reports it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import dflash
from dflash.codehash import file_hashes, tree_sha256

from .conftest import argv, cli_env, run_module


def manifest_tree(package_dir: Path) -> tuple[dict[str, str], str]:
    """An independent implementation of the toolkit's definition."""
    files = {}
    for root, dirs, names in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = Path(root, name)
            if name.endswith((".pyc", ".pyo")) or not path.is_file():
                continue
            key = "dflash/" + path.relative_to(package_dir).as_posix()
            files[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    lines = "".join(f"{k}\0{files[k]}\n" for k in sorted(files))
    return files, hashlib.sha256(lines.encode()).hexdigest()


def test_tree_hash_matches_the_manifest_definition(tmp_path):
    package = tmp_path / "dflash"
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "x.py").write_text("print('é')\n")
    (package / "sub" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (package / "stale.pyc").write_bytes(b"junk")
    files, expected = manifest_tree(package)
    assert set(files) == {"dflash/__init__.py", "dflash/sub/x.py"}
    assert file_hashes(package) == files
    assert tree_sha256(file_hashes(package)) == expected


def test_trainer_reports_the_release_tree_hash(tmp_path):
    release = tmp_path / "releases" / "v-test"
    source = Path(dflash.__file__).parent
    shutil.copytree(source, release / "dflash", ignore=shutil.ignore_patterns("__pycache__"))
    files, tree = manifest_tree(release / "dflash")
    manifest = {"release": "v-test", "tree_sha256": tree, "files": files}
    (release / "MANIFEST.json").write_text(json.dumps(manifest))
    status = tmp_path / "status.json"
    env = cli_env(pythonpath=release)  # only the release's copy of dflash is importable
    args = argv("--target-model tiny --drafter-layers 1 --gen-samples 8 --max-steps 2")
    args += ["--checkpoint-dir", str(tmp_path / "ck"), "--status-file", str(status)]
    result = run_module("dflash.train", *args, "--run-id", "hash-test", cwd=release, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    written = json.loads(status.read_text())
    assert written["code_tree_sha256"] == tree
    assert written["release"] == "v-test"
    assert f"code_tree_sha256: {tree}" in result.stdout
    assert "release: v-test" in result.stdout
    assert f"package: {release / 'dflash'}" in result.stdout
