"""The training data as the toolkit sees it (module_utils/dflash_data.py): a store or file on the
target read without its data, whether a running trainer's data still lie at their path, the
data a job's hosts must share, and the data in verify, the no-op decision and the hints."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest
from dflash_filters import data_findings
from dflash_input_filters import dflash_run_spec
from test_deploy_work import STATE, work

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import (
    changed_under,
    identity,
    length_shift,
    read_data,
    recorded,
)
from dflash.data.store_writer import StoreWriter


def make_store(folder: Path, seed: int = 0, samples: int = 20) -> dict:
    rng = np.random.default_rng(seed)
    with StoreWriter(folder, force=True, say=lambda _: None) as writer:
        lengths = rng.integers(4, 30, samples).astype(np.int64)
        writer.add(rng.integers(0, 100, int(lengths.sum()), dtype=np.int32),
                   np.ones(int(lengths.sum()), np.uint8), lengths)  # fmt: skip
        return writer.finish(sources=[{"name": "a.jsonl", "size": 1, "sha256": "x"}])


def reported(kind: str, path: Path, **fields) -> dict:
    """status.json's `data` as the trainer writes it (dflash/data/store.py summary)."""
    return {"kind": kind, "path": str(path), **fields}


def test_what_lies_at_the_path_is_read_without_the_data(tmp_path):
    made = make_store(tmp_path / "store")
    store = read_data(str(tmp_path / "store"))
    assert store["kind"] == "store" and store["problems"] == []
    assert store["manifest"]["content_sha256"] == made["content_sha256"]
    assert "arrays" not in store["manifest"]
    assert identity(store) == f"store {made['content_sha256']}"
    assert recorded(store)["samples"] == made["samples"] and recorded(store)["kind"] == "store"

    (tmp_path / "a.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    jsonl = read_data(str(tmp_path / "a.jsonl"))
    assert jsonl["kind"] == "jsonl" and jsonl["size"] == 25 and jsonl["mtime"]
    assert identity(jsonl) == "jsonl a.jsonl 25 bytes"
    assert read_data("self_generated") == {"kind": "self_generated"} == read_data(None)
    assert read_data(str(tmp_path / "none"))["kind"] == "missing"
    (tmp_path / "empty").mkdir()
    assert read_data(str(tmp_path / "empty"))["error"].startswith("no manifest.json")
    (tmp_path / "empty" / "manifest.json").write_text("{}")
    assert "has no arrays table" in read_data(str(tmp_path / "empty"))["error"]

    tokens = tmp_path / "store" / "tokens.i32"
    tokens.write_bytes(tokens.read_bytes()[:-4])
    assert read_data(str(tmp_path / "store"))["problems"] == [
        f"tokens.i32 holds {tokens.stat().st_size} bytes, its manifest says "
        f"{tokens.stat().st_size + 4}"
    ]


def test_a_store_prepared_again_truncated_or_removed_is_named(tmp_path):
    made = make_store(tmp_path / "store")
    ran = reported("store", tmp_path / "store", content_sha256=made["content_sha256"])
    assert changed_under(ran, read_data(str(tmp_path / "store"))) is None
    again = make_store(tmp_path / "store", seed=1)
    assert changed_under(ran, read_data(str(tmp_path / "store"))) == (
        f"the store at {tmp_path / 'store'} was prepared again (sha256 "
        f"{made['content_sha256'][:12]} -> {again['content_sha256'][:12]})"
    )
    ran["content_sha256"] = again["content_sha256"]
    (tmp_path / "store" / "offsets.i64").unlink()
    assert "changed on disk: offsets.i64 holds None bytes" in changed_under(
        ran, read_data(str(tmp_path / "store"))
    )
    os.rename(tmp_path / "store", tmp_path / "gone")
    assert changed_under(ran, read_data(str(tmp_path / "store"))) == (
        f"{tmp_path / 'store'} is missing"
    )
    # Self-generated data have no path to change under the trainer.
    assert changed_under({"kind": "self_generated"}, None) is None


def test_a_jsonl_file_that_changed_is_named_by_size_and_time(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("{}\n")
    now = read_data(str(path))
    ran = reported("jsonl", path, sources=[{"size": now["size"], "mtime": now["mtime"]}])
    assert changed_under(ran, now) is None
    path.write_text("{}\n{}\n")
    os.utime(path, (0, 0))
    assert "the file" in changed_under(ran, read_data(str(path))) and "size 3 -> 6" in (
        changed_under(ran, read_data(str(path)))
    )


def test_verify_names_the_data_a_running_trainer_no_longer_finds(tmp_path):
    made = make_store(tmp_path / "store")
    data = reported("store", tmp_path / "store", content_sha256=made["content_sha256"])
    status = {"state": "running", "data": data}
    facts = {
        "current": {"release": "v1"},
        "trainers": {"processes": [{"pid": 7, "status": status}, {"pid": 8, "status": status}]},
        "data": {str(tmp_path / "store"): read_data(str(tmp_path / "store"))},
    }
    assert data_findings(facts) == []
    again = make_store(tmp_path / "store", seed=2)
    facts["data"] = {str(tmp_path / "store"): read_data(str(tmp_path / "store"))}
    (found,) = data_findings(facts)  # one finding per path, not per rank
    assert found["kind"] == "data" and found["pid"] == 7
    assert found["path"] == str(tmp_path / "store")
    assert found["expected"].endswith(f"as the trainer read it at start (sha256 "
                                      f"{made['content_sha256'][:12]})")  # fmt: skip
    assert again["content_sha256"][:12] in found["found"]
    # Started again as its deployment recorded it (a rollback to the current release), not by a
    # deploy that renders run.sh from today's inventory.
    assert found["hint"].startswith("the trainer still trains on what it read")
    assert (
        "ansible-playbook rollback.yml -e dflash_release=v1 starts it again on the data at"
        in (found["hint"])
    )


def test_the_no_op_deploy_restarts_a_trainer_whose_data_changed():
    state = copy.deepcopy(STATE)
    path = "/data/set"
    data = {"kind": "store", "path": path, "content_sha256": "a" * 64}
    state["trainers"]["processes"][0]["status"]["data"] = data
    state["data"] = {path: {"kind": "store", "path": path, "manifest": {"content_sha256": "a" * 64},
                            "problems": []}}  # fmt: skip
    assert work(state) == []
    state["data"][path]["manifest"]["content_sha256"] = "b" * 64
    assert work(state) == [
        "the trainer's data changed since it started: the store at /data/set was prepared "
        "again (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)"
    ]


def test_throughput_hint_names_a_length_shift_first():
    then = {"content_sha256": "a" * 64, "lengths": {"p50": 800, "p90": 1600, "max": 3072}}
    longer = {"content_sha256": "b" * 64, "lengths": {"p50": 1200, "p90": 1650, "max": 3072}}
    assert length_shift(then, longer) == (
        "the data's sample lengths moved (p50 800 -> 1200 tokens): longer or shorter samples "
        "change tokens/s; rule that out first"
    )
    alike = dict(longer, lengths=then["lengths"])
    assert length_shift(then, alike) == (
        "the data changed (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb), with lengths alike"
    )
    assert length_shift(then, then) is None and length_shift(None, longer) is None


@pytest.mark.parametrize(
    ("args", "data", "problem"),
    [
        ({"data": "/x"}, "self_generated", "dflash_trainer_args sets 'data'; name the training "
         "data with dflash_data"),
        ({"data_cache": "/x"}, "self_generated", "dflash_trainer_args sets 'data_cache'"),
        ({}, "data/set", "dflash_data 'data/set' must be self_generated or an absolute path"),
    ],
)  # fmt: skip
def test_the_data_is_named_by_dflash_data_only(args, data, problem):
    spec = dflash_run_spec({"args": args, "data": data})
    assert any(problem in p for p in spec["problems"]), spec["problems"]


def test_dflash_data_becomes_the_data_flag():
    assert dflash_run_spec({"args": {}, "data": "/d/s"})["flags"] == [["--data", "/d/s"]]
    assert dflash_run_spec({"args": {}, "data": "self_generated"})["flags"] == []


def test_a_status_json_data_summary_is_what_verify_reads(tmp_path):
    """The summary the trainer writes (dflash/data/store.py) carries what the toolkit compares."""
    from dflash.data.store import TokenStore

    made = make_store(tmp_path / "store")
    summary = TokenStore.open(tmp_path / "store").summary()
    json.dumps(summary)  # status.json holds it as JSON
    assert summary["kind"] == "store" and summary["path"] == str(tmp_path / "store")
    assert summary["content_sha256"] == made["content_sha256"]
    assert changed_under(summary, read_data(summary["path"])) is None


def test_verify_names_the_data_of_a_run_whose_trainer_is_down(tmp_path):
    """A store truncated in place ends its trainer (its pages are mapped) and every start after:
    with no trainer process, the recorded run's last status still names the data it read."""
    made = make_store(tmp_path / "store")
    data = reported("store", tmp_path / "store", content_sha256=made["content_sha256"])
    tokens = tmp_path / "store" / "tokens.i32"
    os.truncate(tokens, 0)
    # The supervisor wrote `failed` into the dead trainer's status and waits out a back-off;
    # its own process is one of the run's.
    down = {"run_id": "r1", "state": "failed", "data": data}
    facts = {
        "current": {"release": "v1"},
        "trainers": {
            "processes": [{"pid": 9, "run_id": "r1", "status": down}],
            "supervisor": {"state": "backoff"},
            "down_status": down,
        },
        "data": {str(tmp_path / "store"): read_data(str(tmp_path / "store"))},
    }
    (found,) = data_findings(facts)  # the run once, as down
    assert found["pid"] is None and found["path"] == str(tmp_path / "store")
    assert found["found"].startswith(
        f"the store at {tmp_path / 'store'} changed on disk: tokens.i32 holds 0 bytes"
    )
    assert found["hint"].startswith(
        f"the trainer is down (backoff), and its next start reads what lies at "
        f"{tmp_path / 'store'} now: prepare it again"
    )
    assert found["hint"].endswith("ansible-playbook rollback.yml -e dflash_release=v1")
    # No process of the run at all: judged the same.
    facts["trainers"]["processes"] = []
    assert [f["pid"] for f in data_findings(facts)] == [None]
