"""The compile cache's rules in one module (module_utils/dflash_compile_cache.py): the folder's
name, the changes a deploy makes to it, its marker, and verify's findings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    CACHE_SUSPECT_EXIT,
    COMPILED_LIST,
    FAILED,
    MARKER,
    CompiledListError,
    code_key,
    findings,
    fingerprint,
    folder,
    identity,
    listed_files,
    mark,
    move_aside,
    prepare,
    read,
    warm_needed,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import tree_sha256

REPO = Path(__file__).resolve().parents[2]

LOCK = {"python": "3.11", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}


H200 = {"name": "NVIDIA H200", "driver": "580.95.05"}
CODE = {"compiled_sha256": "ab" * 32}


def test_the_folder_is_named_by_versions_gpu_driver_and_compiled_code():
    built_by = identity(LOCK, H200, CODE)
    assert folder("/opt/dflash", built_by) == f"/opt/dflash/cache/{fingerprint(built_by)}"
    assert fingerprint(json.loads(json.dumps(built_by, sort_keys=True))) == fingerprint(built_by)
    assert identity(None, None, {"tree_sha256": "t"}) == {
        "torch": None, "triton": None, "cuda": None, "gpu": "cpu", "driver": None,
        "tree_sha256": "t",
    }  # fmt: skip
    others = [
        identity({**LOCK, "torch": "2.12.0"}, H200, CODE),
        identity({**LOCK, "triton": "3.5.0"}, H200, CODE),
        identity(LOCK, {**H200, "name": "NVIDIA H100"}, CODE),
        identity(LOCK, {**H200, "driver": "570.1"}, CODE),
        identity(LOCK, H200, {"compiled_sha256": "cd" * 32}),
    ]
    assert len({fingerprint(built_by), *map(fingerprint, others)}) == 6


COMPILED_PY = b'''"""doc"""
FILES = (
    "dflash/model.py",
    "dflash/step.py",
)
'''


def test_the_code_key_covers_only_the_listed_files():
    files = {"dflash/model.py": "1", "dflash/step.py": "2", "dflash/train.py": "3"}
    key = code_key(files, COMPILED_PY)
    assert set(key) == {"compiled_sha256"}
    assert code_key({**files, "dflash/train.py": "4", "dflash/README.md": "5"}, COMPILED_PY) == key
    assert code_key({**files, "dflash/model.py": "9"}, COMPILED_PY) != key
    # A release from before the list: its whole tree, as then.
    assert code_key(files, None) == {"tree_sha256": tree_sha256(files)}
    with pytest.raises(CompiledListError, match=r"dflash/step\.py, which the release does not"):
        code_key({"dflash/model.py": "1"}, COMPILED_PY)
    with pytest.raises(CompiledListError, match="no FILES"):
        code_key(files, b"OTHER = ()\n")


def test_the_repository_list_names_files_of_the_package():
    listed = listed_files((REPO / COMPILED_LIST).read_bytes())
    assert listed and all((REPO / path).is_file() for path in listed)


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
    wanted = {**identity(LOCK, None, CODE), "warmup_flags": ["--seq-len", "64"]}
    assert warm_needed(str(cache), wanted)
    (cache / MARKER).write_text('{"torch": "2.1')  # torn: a warmup must run again
    assert warm_needed(str(cache), wanted)
    mark(str(cache), wanted)
    assert json.loads((cache / MARKER).read_text()) == wanted
    assert not warm_needed(str(cache), wanted)
    assert warm_needed(str(cache), {**wanted, "warmup_flags": ["--seq-len", "128"]})
    # The trainer's environment is a warmup input too: Inductor's keys read it.
    assert warm_needed(str(cache), {**wanted, "warmup_env": {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}})
    assert sorted(p.name for p in cache.iterdir()) == [MARKER]


def test_verify_findings(tmp_path: Path):
    root = tmp_path
    built_by = identity(LOCK, None, CODE)
    cache_dir = Path(folder(str(root), built_by))
    assert findings(None, LOCK, []) == []
    missing = read(str(root), str(cache_dir))
    assert [f["found"] for f in findings(missing, LOCK, [])] == ["missing"]
    cache_dir.mkdir(parents=True)
    # Warmup inputs sit beside the identity in the marker; they never make it another build's.
    inputs = {"warmup_flags": ["--compile-drafter"], "warmup_env": {"A": "1"}}
    mark(str(cache_dir), {**built_by, **inputs})
    here = read(str(root), str(cache_dir))
    assert here["all"] == [cache_dir.name] and findings(here, LOCK, []) == []
    [upgraded] = findings(here, {**LOCK, "torch": "2.12.0"}, [])
    assert upgraded["found"] == "built for torch 2.11.0+cu130 on cpu, code abababababab"
    assert upgraded["hint"].endswith("-e dflash_compile_cache=clear")
    moved = root / "cache" / "0123456789abcdef"  # another build's folder renamed by hand
    cache_dir.rename(moved)
    [other] = findings(read(str(root), str(moved)), LOCK, [])
    assert other["expected"] == "a cache named 0123456789abcdef, torch 2.11.0+cu130"
    moved.rename(cache_dir)
    procs = [{"pid": 7, "cache_dir": str(root / "cache" / "g")}, {"pid": 8, "cache_dir": None}]
    [stray] = findings(here, LOCK, procs)
    assert stray["pid"] == 7 and stray["found"] == f"pid 7 uses {root / 'cache' / 'g'}"


def test_a_cache_moved_aside_by_the_deploy_is_named_as_the_trainer_names_one(tmp_path):
    """The warmup module and the trainer's supervisor set a suspect cache aside alike, so verify
    reads both kinds the same way, newest first, with why."""
    from dflash.supervision import files as supervisor_files
    from dflash.supervision import record as supervision

    assert CACHE_SUSPECT_EXIT == supervision.CACHE_SUSPECT_EXIT
    cache = tmp_path / "cache" / "0123456789abcdef"
    cache.mkdir(parents=True)
    by_trainer = supervisor_files.move_aside(cache, "loss is nan at step 1", "run-1")
    cache.mkdir()
    by_deploy = Path(move_aside(str(cache), "failed its canary: exit 3"))
    assert by_trainer.name.startswith(f"{cache.name}.failed-")
    assert by_deploy.name.startswith(f"{cache.name}.failed-")
    assert json.loads((by_deploy / FAILED).read_text())["reason"] == "failed its canary: exit 3"
    cache.mkdir()
    seen = read(str(tmp_path), str(cache))
    assert seen["exists"] and {a["name"] for a in seen["moved_aside"]} == {
        by_trainer.name, by_deploy.name,
    }  # fmt: skip
    assert {a["reason"] for a in seen["moved_aside"]} == {
        "loss is nan at step 1", "failed its canary: exit 3",
    }  # fmt: skip
