"""history.jsonl under faults (a torn last line, a write cut short by a full disk, a damaged line
in the middle), the leftovers a killed writer leaves, and a deploy's disk estimate, on real
files and, for the full disk, a real tmpfs."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from dflash_filters import dflash_findings

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import MB, deploy_need
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_history import select
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_leftovers import clean
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    append_history,
    read_history_checked,
    write_json_atomic,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state_findings import (
    history_findings,
)
from dflash.supervision.files import append_line


def torn_history(root: Path) -> bytes:
    append_history(str(root), {"release": "v1", "result": "healthy"})
    torn = b'{"release": "v2", "res'
    with (root / "history.jsonl").open("ab") as handle:
        handle.write(torn)
    return torn


@pytest.mark.parametrize("writer", ["toolkit", "supervisor"])
def test_an_append_after_a_torn_line_starts_its_own_line_and_keeps_the_torn_one(
    tmp_path: Path, writer: str
) -> None:
    torn = torn_history(tmp_path)
    entries, damaged = read_history_checked(str(tmp_path))
    assert [e["release"] for e in entries] == ["v1"]
    assert damaged == [{"line": 2, "bytes": len(torn), "text": torn.decode()}]
    new = {"release": "v3", "result": "healthy"}
    if writer == "toolkit":
        moved = append_history(str(tmp_path), new)
        kept = str(tmp_path / "history.jsonl.torn")
        assert moved == {"line": 2, "bytes": len(torn), "kept": kept}
    else:
        append_line(tmp_path / "history.jsonl", (json.dumps(new) + "\n").encode())
    entries, damaged = read_history_checked(str(tmp_path))
    assert [e["release"] for e in entries] == ["v1", "v3"] and damaged == []
    assert (tmp_path / "history.jsonl.torn").read_bytes() == torn + b"\n"


def test_a_damaged_line_in_the_middle_is_a_finding_with_its_number(tmp_path: Path) -> None:
    append_history(str(tmp_path), {"release": "v1"})
    with (tmp_path / "history.jsonl").open("a") as handle:
        handle.write("edited by hand\n")
    append_history(str(tmp_path), {"release": "v2"})
    entries, damaged = read_history_checked(str(tmp_path))
    assert [e["release"] for e in entries] == ["v1", "v2"]
    found = history_findings({"root": str(tmp_path), "history_damaged": damaged})
    assert [(f["kind"], f["line"]) for f in found] == [("history", 2)]
    assert not (tmp_path / "history.jsonl.torn").exists()  # only a torn last line is moved


@pytest.fixture
def full_disk(tmpfs) -> Path:
    """A 1 MB tmpfs filled to the last byte."""
    folder = tmpfs("1m")
    append_history(str(folder), {"release": "v1", "result": "healthy"})
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return folder


def test_a_write_cut_short_by_a_full_disk_leaves_no_torn_line(full_disk: Path) -> None:
    before = (full_disk / "history.jsonl").read_bytes()
    big = {"release": "v2", "run_sh_text": "x" * 20000}
    with pytest.raises(OSError):
        append_history(str(full_disk), big)
    with pytest.raises(OSError):
        append_line(full_disk / "history.jsonl", (json.dumps(big) + "\n").encode())
    assert (full_disk / "history.jsonl").read_bytes() == before
    with pytest.raises(OSError):
        write_json_atomic(str(full_disk / "trainer.json"), big)
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "history.jsonl"]


def test_leftovers_of_killed_writers_are_removed_and_named(tmp_path: Path) -> None:
    (tmp_path / "envs" / "lock-done").mkdir(parents=True)
    (tmp_path / "envs" / "lock-done" / ".dflash-env.json").write_text("{}")
    (tmp_path / "envs" / "lock-cut").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / ".tmp-latest-42").symlink_to("nowhere")
    (tmp_path / "trainer.json..tmp-42").write_text("")
    (tmp_path / "current").symlink_to("releases/v1")
    (tmp_path / ".incoming").mkdir()
    (tmp_path / ".incoming" / "v2.tar.gz").write_bytes(b"half")
    # An unpack of another host's compile cache cut short, beside the cache and one set aside.
    (tmp_path / "cache" / "3f2a.incoming-77" / "fxgraph").mkdir(parents=True)
    (tmp_path / "cache" / "3f2a" / "fxgraph").mkdir(parents=True)
    (tmp_path / "cache" / "3f2a.failed-20261203T010203Z").mkdir()
    torn_history(tmp_path)
    said = clean(str(tmp_path))
    gone = ["runs/.tmp-latest-42", "trainer.json..tmp-42", ".incoming/v2.tar.gz", "envs/lock-cut",
            "cache/3f2a.incoming-77"]  # fmt: skip
    for name in gone:
        assert not (tmp_path / name).is_symlink() and not (tmp_path / name).exists(), name
        assert any(str(tmp_path / name) in line for line in said), (name, said)
    assert (tmp_path / "envs" / "lock-done").is_dir() and (tmp_path / "current").is_symlink()
    assert (tmp_path / "cache" / "3f2a" / "fxgraph").is_dir()
    assert (tmp_path / "cache" / "3f2a.failed-20261203T010203Z").is_dir(), "kept for a person"
    assert any("history.jsonl.torn" in line for line in said)
    assert clean(str(tmp_path)) == []  # nothing twice


def test_the_disk_estimate_refuses_only_a_deploy_that_writes_into_the_reserve() -> None:
    state = {
        "disk": {"path": "/opt", "free_bytes": 1500 * MB, "total_bytes": 10000 * MB},
        "release_check": {"present": False},
        "wanted_env": {
            "lock_id": "lock-a",
            "estimate_bytes": 1000 * MB,
            "estimate_basis": "5x its 3 wheels",
        },
    }
    refused = deploy_need(state, 10 * MB, reserve_mb=1024)
    assert not refused["ok"] and refused["need_bytes"] == 1010 * MB
    assert "1,500 MB free" in refused["msg"] and "1,010 MB" in refused["msg"]
    assert deploy_need(state, 10 * MB, reserve_mb=400)["ok"]
    nothing_new = {**state, "release_check": {"present": True}, "wanted_env": {"exists": True}}
    nothing_new["disk"] = {**state["disk"], "free_bytes": 0}
    assert deploy_need(nothing_new, 10 * MB, reserve_mb=1024)["ok"]


def test_an_interrupted_line_names_an_intent_and_no_code() -> None:
    """A deploy killed after its record, then taken over: the `interrupted` line of the same
    release is no deployment to compare the release with, nor to select."""
    recorded = {"action": "deploy", "release": "v6", "result": "healthy", "tree_sha256": "t6"}
    interrupted = {"action": "deploy", "release": "v6", "result": "interrupted", "phase": "record"}
    facts = {
        "root": "/opt/dflash", "root_exists": True, "history": [recorded, interrupted],
        "current": {"release": "v6", "manifest": {"tree_sha256": "t6"}},
    }  # fmt: skip
    assert [f for f in dflash_findings(facts) if f["kind"] == "release"] == []
    assert select([recorded, interrupted], "v6", "v6") == 0
    assert select([recorded, interrupted], "v6", "last") == 0


@pytest.mark.parametrize("holder_alive", [True, False])
def test_the_release_a_locked_run_makes_current_is_not_lost_history(holder_alive: bool) -> None:
    """A deploy writes the new release's history line at its record step, after its health
    check: a verify beside it (a cron's) named that release as lost history. The lock's own
    finding says the run is in progress, or was interrupted and how to finish it."""
    lock = {"action": "deploy", "release": "v2", "holder": {"pid": 1}, "age_s": 5,
            "holder_alive": holder_alive}  # fmt: skip
    facts = {
        "root": "/opt/dflash", "root_exists": True, "current": {"release": "v2"},
        "releases": ["v1", "v2"], "unknown_releases": ["v2"], "history_exists": True,
        "deploy_lock": lock,
    }  # fmt: skip
    kinds = [(f["kind"], f.get("state")) for f in dflash_findings(facts)]
    assert ("history", None) not in kinds
    assert ("release", "in_progress" if holder_alive else "interrupted") in kinds
    # The first deploy of a root: no history yet, the only release the one in flight.
    first = {**facts, "releases": ["v2"], "history_exists": False}
    assert "history" not in [f["kind"] for f in dflash_findings(first)]
    # Without the lock, the same root has lost its history: named, with what it does not name.
    for unlocked in ({**facts, "deploy_lock": None}, {**first, "deploy_lock": None, "releases":
                                                       ["v1", "v2"]}):  # fmt: skip
        [lost] = [f for f in dflash_findings(unlocked) if f["kind"] == "history"]
        assert lost["found"].endswith("releases it does not name: v2"), lost
