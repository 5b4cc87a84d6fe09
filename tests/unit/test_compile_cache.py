"""The compile cache's rules in one module (module_utils/dflash_compile_cache.py): the folder's
name, the changes a deploy makes to it, its marker, and verify's findings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ansible.module_utils.dflash_compile_cache import (
    MARKER,
    findings,
    fingerprint,
    folder,
    identity,
    mark,
    prepare,
    read,
    warm_needed,
)
from ansible.plugins.filter.core import to_json

LOCK = {"python": "3.11", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}


def test_the_folder_keeps_the_name_the_jinja_rule_gave_it():
    """Earlier deployments named the folder in Jinja (to_json | hash('sha256'))[:16]: the
    same build finds its warm cache after the upgrade."""
    built_by = identity(LOCK, "NVIDIA H200", "ab" * 32)
    jinja = hashlib.sha256(to_json(built_by).encode()).hexdigest()[:16]
    assert fingerprint(built_by) == jinja
    assert folder("/opt/dflash", built_by) == f"/opt/dflash/cache/{jinja}"
    assert identity(None, None, "t") == {
        "torch": None, "triton": None, "cuda": None, "gpu": "cpu", "tree_sha256": "t"
    }  # fmt: skip
    others = [
        identity({**LOCK, "torch": "2.12.0"}, "NVIDIA H200", "ab" * 32),
        identity(LOCK, "NVIDIA H100", "ab" * 32),
        identity(LOCK, "NVIDIA H200", "cd" * 32),
    ]
    assert len({fingerprint(built_by), *map(fingerprint, others)}) == 4


def test_prepare_creates_clears_and_says_what(tmp_path: Path):
    root = tmp_path / "root"
    mine, other = root / "cache" / "a", root / "cache" / "b"
    assert prepare(str(root), str(mine), False, False, dry_run=True) == [f"created {mine}"]
    assert not mine.exists()
    assert prepare(str(root), str(mine), False, False, dry_run=False) == [f"created {mine}"]
    assert prepare(str(root), str(mine), False, False, dry_run=False) == []
    other.mkdir()
    (mine / "fx").write_text("compiled")
    assert prepare(str(root), str(mine), True, False, dry_run=True) == [
        f"removed {mine}", f"created {mine}"]  # fmt: skip
    assert (mine / "fx").exists()
    assert prepare(str(root), str(mine), True, False, dry_run=False) == [
        f"removed {mine}", f"created {mine}"]  # fmt: skip
    assert list(mine.iterdir()) == [] and other.is_dir()
    assert prepare(str(root), str(mine), True, True, dry_run=False) == [
        f"removed {root / 'cache'}", f"created {mine}"]  # fmt: skip
    assert not other.exists() and mine.is_dir()


def test_the_marker_decides_the_warmup(tmp_path: Path):
    cache = tmp_path / "cache" / "f"
    cache.mkdir(parents=True)
    wanted = {**identity(LOCK, "cpu", "t"), "warmup_flags": ["--seq-len", "64"]}
    assert warm_needed(str(cache), wanted)
    (cache / MARKER).write_text('{"torch": "2.1')  # torn: a warmup must run again
    assert warm_needed(str(cache), wanted)
    mark(str(cache), wanted)
    assert json.loads((cache / MARKER).read_text()) == wanted
    assert not warm_needed(str(cache), wanted)
    assert warm_needed(str(cache), {**wanted, "warmup_flags": ["--seq-len", "128"]})
    assert sorted(p.name for p in cache.iterdir()) == [MARKER]


def test_verify_findings(tmp_path: Path):
    root = tmp_path
    cache_dir = root / "cache" / "f"
    assert findings(None, "t", LOCK, []) == []
    missing = read(str(root), str(cache_dir))
    assert [f["found"] for f in findings(missing, "t", LOCK, [])] == ["missing"]
    cache_dir.mkdir(parents=True)
    mark(str(cache_dir), identity(LOCK, "cpu", "t"))
    here = read(str(root), str(cache_dir))
    assert here["all"] == ["f"] and findings(here, "t", LOCK, []) == []
    [other] = findings(here, "u" * 12, LOCK, [])
    assert other["found"] == "built by torch 2.11.0+cu130 for tree t"
    assert other["hint"].endswith("-e dflash_compile_cache=clear")
    procs = [{"pid": 7, "cache_dir": str(root / "cache" / "g")}, {"pid": 8, "cache_dir": None}]
    [stray] = findings(here, "t", LOCK, procs)
    assert stray["pid"] == 7 and stray["found"] == f"pid 7 uses {root / 'cache' / 'g'}"
