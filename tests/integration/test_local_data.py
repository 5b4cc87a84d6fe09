"""Training data on the local target (dflash_data): a JSONL file prepared by the trainer into
<root>/data-cache, a prepared store, the store prepared again under the running trainer
(verify's `data` finding), the deploy that restarts it on the new data (its checkpoint's order
not resumed on other data), and diff.yml's data section; a path that is not there is refused
before anything changes; a store truncated in place, which ends the trainer and every start
after it, is still named while the trainer is down."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from dflash.data.prepare import prepare
from dflash.data.records import Settings
from tests.integration.conftest import TRAINER_ARGS, read_json, status_of, write_records

ARGS = {key: value for key, value in TRAINER_ARGS.items() if key != "gen_samples"}


def history(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def kinds(run) -> list[str]:
    return [item["kind"] for item in run.report["hosts"]["local"]["findings"]]


def test_a_missing_store_is_refused_before_any_change(playbook, target_root, tmp_path):
    missing = tmp_path / "no-such-store"
    result = playbook("deploy.yml", dflash_data=str(missing))
    assert result.rc != 0
    flat = " ".join(result.output.split())
    assert f"dflash_data '{missing}' on local: no such file or folder on the target" in flat
    assert f"-m dflash.data prepare --out {missing} FILE.jsonl" in flat
    assert not (target_root / "releases").exists() and not (target_root / "history.jsonl").exists()


def test_data_from_jsonl_to_a_store_prepared_again_under_the_trainer(
    deploy, playbook, target_root, tmp_path, source_repo
):
    jsonl = write_records(tmp_path / "a.jsonl", seed=1, length=40)
    first = deploy("v1", dflash_trainer_args=ARGS, dflash_data=str(jsonl))
    assert first.rc == 0, first.output
    status = status_of(target_root)
    assert status["data"]["kind"] == "jsonl" and status["data"]["path"] == str(jsonl)
    assert Path(status["data"]["store"]).parent == target_root / "data-cache"
    assert history(target_root)[-1]["data"]["content_sha256"] == status["data"]["content_sha256"]

    store = tmp_path / "store"
    settings = Settings(max_seq_len=3072, vocab_size=128, tokenizer=None)
    old = prepare([write_records(tmp_path / "b.jsonl", 2, 40)], store, settings, say=print)
    second = deploy("v1", dflash_trainer_args=ARGS, dflash_data=str(store))
    assert second.rc == 0, second.output
    # Why it ran, in the terms the user set: the data, with both paths and contents.
    switch = (f"data: {jsonl} (jsonl {status['data']['content_sha256'][:12]}) -> {store} "
              f"(store {old['content_sha256'][:12]})")  # fmt: skip
    assert switch in history(target_root)[-1]["why"], history(target_root)[-1]["why"]
    assert switch in " ".join(second.output.split())
    assert status_of(target_root)["data"]["content_sha256"] == old["content_sha256"]
    assert playbook("verify.yml").rc == 0

    # The store is prepared again, from longer samples, while the trainer reads the old one.
    new = prepare([write_records(tmp_path / "c.jsonl", 3, 80)], store, settings, force=True,
                  say=print)  # fmt: skip
    audit = playbook("verify.yml")
    assert audit.rc != 0 and kinds(audit) == ["data"], audit.output
    [item] = audit.report["hosts"]["local"]["findings"]
    assert item["path"] == str(store)
    assert item["found"] == (
        f"the store at {store} was prepared again (sha256 {old['content_sha256'][:12]} -> "
        f"{new['content_sha256'][:12]})"
    )
    # The hint, run as written, starts the trainer again as its deployment recorded it (the
    # -e settings it was made with included) on the data there now.
    [hint] = re.findall(r"ansible-playbook rollback\.yml -e dflash_release=\S+", item["hint"])
    assert hint == "ansible-playbook rollback.yml -e dflash_release=v1", item["hint"]
    run_sh = (target_root / "run.sh").read_bytes()
    third = playbook("rollback.yml", dflash_release="v1", dflash_launch=True,
                     dflash_health_timeout=180)  # fmt: skip
    assert third.rc == 0, third.output
    assert (target_root / "run.sh").read_bytes() == run_sh
    # The launch's reason (module_utils/dflash_plan.py); YAML output doubles the quote.
    flat = " ".join(third.output.split())
    assert "the trainer''s data changed since it started: the store at" in flat
    status = status_of(target_root)
    assert status["data"]["content_sha256"] == new["content_sha256"]
    assert status["data_order"].startswith(
        f"new data order: the data differ from the checkpoint's (sha256 "
        f"{old['content_sha256'][:12]} -> {new['content_sha256'][:12]})"
    )
    lines = history(target_root)
    assert [line["data"]["content_sha256"] for line in lines[-2:]] == [
        old["content_sha256"], new["content_sha256"]
    ]  # fmt: skip
    assert playbook("verify.yml").rc == 0

    diff = playbook("diff.yml", dflash_diff_json=str(tmp_path / "diff.json"))
    assert diff.rc == 0, diff.output
    found = json.loads((tmp_path / "diff.json").read_text())["hosts"]["local"]
    changes = {c["name"]: (c["from"], c["to"]) for c in found["changes"] if c["section"] == "data"}
    assert changes["content_sha256"] == (old["content_sha256"], new["content_sha256"])
    assert changes["lengths.p50"] == (40, 80)
    assert changes["tokens"] == (8000, 16000)
    assert "lengths.p50" in diff.output

    # A rollback checks the data of the deployment it restores, as a deploy checks dflash_data:
    # v2 on generated data, the store moved away, then a plain rollback to v1 is refused.
    source_repo("v2", {"dflash/NOTE.txt": "v2\n"})
    assert deploy("v2", dflash_trainer_args=ARGS).rc == 0
    store.rename(tmp_path / "store-moved")
    before = history(target_root)
    refused = playbook("rollback.yml")
    assert refused.rc != 0
    flat = " ".join(refused.output.split())
    # The way out names a ref deploy.yml takes (the release's commit, not its release id).
    [commit] = {e["commit"] for e in before if e.get("release") == "v1"}
    assert (
        f"which this rollback restores, trained on '{store}': no such file or folder on the "
        "target now; nothing was changed. Put the data back there, or deploy that release's "
        "commit with dflash_data naming where the data are now and the trainer flags it ran "
        f"with (history.yml lists them): deploy.yml -e dflash_ref={commit} -e dflash_data=PATH."
    ) in flat, refused.output
    assert history(target_root) == before
    assert (target_root / "current").resolve().name == before[-1]["release"]


def test_a_store_truncated_in_place_is_named_while_its_trainer_is_down(
    deploy, playbook, target_root, tmp_path
):
    store = tmp_path / "store"
    settings = Settings(max_seq_len=3072, vocab_size=128, tokenizer=None)
    made = prepare([write_records(tmp_path / "a.jsonl", 4, 40)], store, settings, say=print)
    # A long back-off: the trainer stays down while verify looks.
    policy = {"backoff": 600, "backoff_max": 600}
    first = deploy("v1", dflash_trainer_args=ARGS, dflash_data=str(store),
                   dflash_restart_policy=policy)  # fmt: skip
    assert first.rc == 0, first.output
    run_id = read_json(target_root / "trainer.json")["run_id"]

    # Cut in place under the trainer: its mapped pages are gone, its next read ends it.
    os.truncate(store / "tokens.i32", 0)
    supervisor = target_root / "runs" / run_id / "supervisor.json"
    deadline = time.monotonic() + 180
    while (read_json(supervisor) or {}).get("state") != "backoff":
        assert time.monotonic() < deadline, f"the trainer never went down: {read_json(supervisor)}"
        time.sleep(0.5)

    audit = playbook("verify.yml")
    assert audit.rc != 0, audit.output
    found = {item["kind"]: item for item in audit.report["hosts"]["local"]["findings"]}
    assert "trainer_down" in found, audit.output
    data = found["data"]
    assert data["pid"] is None and data["path"] == str(store)
    assert data["expected"].endswith(f"(sha256 {made['content_sha256'][:12]})")
    assert data["found"].startswith(f"the store at {store} changed on disk: tokens.i32 holds 0")
    assert data["hint"].startswith(f"the trainer is down (backoff), and its next start reads what "
                                   f"lies at {store} now")  # fmt: skip
