"""The release contracts (docs/deploy.md, docs/state.md): ids, tree hash, archive."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import (
    build_archive,
    release_id_problem,
    tree_sha256,
)


def test_tree_hash_is_sha256_of_sorted_path_nul_sha_lines():
    files = {"dflash/b.py": "22" * 32, "dflash/a.py": "11" * 32}
    expected = hashlib.sha256(
        f"dflash/a.py\0{'11' * 32}\ndflash/b.py\0{'22' * 32}\n".encode()
    ).hexdigest()
    assert tree_sha256(files) == expected
    assert tree_sha256({}) == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("v1.4.0", None),
        ("g0123456789ab", None),
        ("wt-0123456789ab", None),
        ("", "empty"),
        ("release/1", "'/'"),
        ("v1..2", "'..'"),
        ("v 1", "whitespace"),
        ("v1\t", "whitespace"),
        ("-v1", "only letters"),
        ("v1;rm", "only letters"),
    ],
)
def test_release_id_rules(name, problem):
    found = release_id_problem(name)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_archive_is_reproducible_and_normalised():
    contents = {"dflash/z.py": (b"z = 1\n", 0o100664), "dflash/a.sh": (b"#!/bin/sh\n", 0o100775)}
    manifest = {"release": "v1", "tree_sha256": "x", "files": {}}
    first = build_archive(contents, manifest, mtime=1_700_000_000)
    second = build_archive(dict(reversed(list(contents.items()))), manifest, mtime=1_700_000_000)
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["MANIFEST.json", "dflash/a.sh", "dflash/z.py"]
        assert {(m.uid, m.gid, m.uname, m.mtime) for m in members} == {(0, 0, "", 1_700_000_000)}
        modes = {m.name: m.mode for m in members}
        assert modes == {"MANIFEST.json": 0o644, "dflash/a.sh": 0o755, "dflash/z.py": 0o644}
        assert json.loads(tar.extractfile("MANIFEST.json").read()) == manifest
    # A different mtime is a different archive: the mtime is part of the recipe.
    assert build_archive(contents, manifest, mtime=1) != first
