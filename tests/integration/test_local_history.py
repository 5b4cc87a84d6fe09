"""history.yml and diff.yml on the local target: every deployment listed, and the diff of two
names exactly the file, the package version and the run.sh value that changed. Staged deploys
(no trainer) with small self-built wheels keep it fast; the health gate has its own tests."""

from __future__ import annotations

import json

from tests.helpers import REPO
from tests.integration.conftest import PKG, small_lock


def test_history_lists_and_diff_names_exactly_what_changed(
    source_repo, playbook, wheelhouse, tmp_path
):
    source_repo("v1", {"dflash/__init__.py": "VERSION = 1\n", "dflash/model.py": "LAYERS = 5\n"})
    repo = source_repo(
        "v2", {"dflash/__init__.py": "VERSION = 1\n", "dflash/model.py": "LAYERS = 6\n"}
    )
    reports = tmp_path / "out"

    def deploy(ref: str, version: str, steps: int):
        run = playbook(
            "deploy.yml", dflash_source_dir=str(repo), dflash_ref=ref,
            dflash_env_lock=small_lock(wheelhouse, version),
            dflash_trainer_args={"max_steps": steps},
        )  # fmt: skip
        assert run.rc == 0, run.output

    deploy("v1", "1.0", 100)
    deploy("v2", "1.1", 200)

    listed = playbook("history.yml", dflash_history_json=str(reports / "history.json"))
    assert listed.rc == 0 and listed.changed() == 0, listed.output
    rows = json.loads((reports / "history.json").read_text())["hosts"]["local"]
    assert [(r["number"], r["release"], r["result"]) for r in rows] == [
        (1, "v1", "deployed"),
        (2, "v2", "deployed"),
    ]
    assert rows[0]["lock_id"] != rows[1]["lock_id"]
    assert "current: v2" in listed.output and "deployed" in listed.output

    diff = playbook("diff.yml", dflash_diff_json=str(reports / "diff.json"))
    assert diff.rc == 0 and diff.changed() == 0, diff.output
    found = json.loads((reports / "diff.json").read_text())["hosts"]["local"]
    assert (found["from"]["release"], found["to"]["release"]) == ("v1", "v2")
    files = found["files"]
    assert (files["added"], files["removed"], files["changed"]) == ([], [], ["dflash/model.py"])
    assert "-LAYERS = 5\n+LAYERS = 6" in files["text"]["dflash/model.py"]
    changed = {(c["section"], c["name"]): (c["from"], c["to"]) for c in found["changes"]}
    assert changed.pop(("environment", PKG)) == ("1.0", "1.1")
    assert changed.pop(("run_sh", "trainer_args.max_steps")) == (100, 200)
    # Besides those three, only the identities that follow from them differ (the compile
    # cache folder is named by the code tree's fingerprint).
    assert set(changed) == {
        ("release", "release"), ("release", "tree_sha256"), ("release", "commit"),
        ("release", "lock_id"), ("run_sh", "cache_dir"),
    }  # fmt: skip
    assert "+LAYERS = 6" in diff.output and "trainer_args.max_steps" in diff.output

    # Any two by number, in either direction; an unknown selector names itself and the choices.
    back = playbook("diff.yml", dflash_diff_json=str(reports / "d.json"), dflash_diff_from="2",
                    dflash_diff_to="v1")  # fmt: skip
    assert back.rc == 0, back.output
    reverse = json.loads((reports / "d.json").read_text())["hosts"]["local"]
    assert ("environment", PKG, "1.1", "1.0") in {
        (c["section"], c["name"], c["from"], c["to"]) for c in reverse["changes"]
    }
    bad = playbook("diff.yml", dflash_diff_json=str(reports / "x.json"), dflash_diff_from="v9")
    assert bad.rc != 0
    assert "no deployment matches 'v9'" in bad.output and "fastest" in bad.output


def test_a_deployment_made_by_another_controller_is_named(
    source_repo, playbook, wheelhouse, target_root
):
    """Two checkouts (or controllers) deploying to one state root: history records each one's
    checkout folder, and a deploy says when the running deployment came from another."""
    repo = source_repo("v1", {"dflash/__init__.py": "VERSION = 1\n"})
    other = {
        "user": "ci",
        "host": "runner-1",
        "toolkit_commit": "abc1234",
        "checkout": "/srv/ci/dflash-deploy",
        "remote": "https://git.example/dflash.git",
    }
    common = {"dflash_source_dir": str(repo), "dflash_ref": "v1",
              "dflash_env_lock": small_lock(wheelhouse, "1.0")}  # fmt: skip
    first = playbook("deploy.yml", **common, dflash_controller=other)
    assert first.rc == 0, first.output
    assert "another controller" not in first.output

    mine = playbook("deploy.yml", **common, dflash_trainer_args={"max_steps": 7})
    assert mine.rc == 0, mine.output
    said = " ".join(mine.output.split())
    assert (
        "was made by another controller: ci@runner-1:/srv/ci/dflash-deploy "
        "(https://git.example/dflash.git), toolkit commit abc1234; this run is "
    ) in said, mine.output
    lines = [json.loads(x) for x in (target_root / "history.jsonl").read_text().splitlines()]
    assert lines[-1]["controller"]["checkout"] == str(REPO.resolve())
    assert "remote" in lines[-1]["controller"]

    again = playbook("deploy.yml", **common, dflash_trainer_args={"max_steps": 7})
    assert again.rc == 0 and "another controller" not in again.output, again.output
