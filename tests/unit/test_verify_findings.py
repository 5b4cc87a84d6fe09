"""verify's findings from a facts document (filter_plugins/dflash_verify_throughput.py)."""

from __future__ import annotations

from dflash_filters import dflash_findings, dflash_report_lines, while_in_progress


def facts(**overrides) -> dict:
    base = {
        "root": "/opt/dflash",
        "root_exists": True,
        "current": {
            "release": "v2",
            "link": "releases/v2",
            "dangling": False,
            "manifest": {"release": "v2", "tree_sha256": "t2"},
            "manifest_consistent": True,
        },
        "files": {"changed": [], "missing": [], "extra": []},
        "history": [
            {"release": "v1", "tree_sha256": "t1", "result": "healthy"},
            {"release": "v2", "tree_sha256": "t2", "result": "healthy"},
        ],
    }
    base.update(overrides)
    return base


def test_clean_state_has_no_findings():
    assert dflash_findings(facts()) == []
    assert dflash_report_lines([]) == ["OK: no drift"]


def test_each_file_drift_is_named():
    found = dflash_findings(
        facts(files={"changed": ["dflash/a.py"], "missing": ["dflash/b.py"], "extra": ["x.py"]})
    )
    assert [(f["kind"], f["path"], f["state"]) for f in found] == [
        ("code", "dflash/a.py", "changed"),
        ("code", "dflash/b.py", "missing"),
        ("code", "x.py", "extra"),
    ]
    assert all(f["hint"] for f in found)
    assert any("dflash/b.py" in line for line in dflash_report_lines(found))


def test_missing_root_and_dangling_current_are_release_findings():
    assert dflash_findings(facts(root_exists=False))[0]["kind"] == "release"
    dangling = facts(current={"release": None, "link": "releases/gone", "dangling": True})
    [finding] = dflash_findings(dangling)
    assert finding["kind"] == "release" and "releases/gone" in finding["found"]


def test_edited_manifest_and_switch_outside_the_toolkit():
    current = dict(facts()["current"], manifest_consistent=False)
    assert [f["kind"] for f in dflash_findings(facts(current=current))] == ["release"]
    switched = facts(
        history=[
            {"release": "v2", "tree_sha256": "t2", "result": "healthy"},
            {"release": "v1", "result": "healthy"},
            # A failed line does not make its release current: the switch is still named.
            {"release": "v3", "result": "failed"},
        ]
    )
    [finding] = dflash_findings(switched)
    assert finding["expected"] == "v1" and finding["found"] == "v2"


def test_a_run_in_progress_or_interrupted_is_named_instead_of_a_switch():
    holder = {"user": "u", "host": "ctl", "pid": 4242, "boot_id": "other-kernel"}
    lock = {"action": "deploy", "release": "v2", "phase": "launch", "holder": holder}
    history = [{"release": "v1", "tree_sha256": "t1", "result": "healthy"}]
    # The holder is known dead (the target saw its process gone): interrupted, not "switched".
    dead = dflash_findings(facts(history=history, deploy_lock=dict(lock, holder_alive=False)))
    assert [(f["kind"], f["state"]) for f in dead] == [("release", "interrupted")]
    assert "deploy of v2" in dead[0]["found"] and "phase launch" in dead[0]["found"]
    # Alive, or not knowable but renewed recently: in progress.
    live = dflash_findings(facts(deploy_lock=dict(lock, holder_alive=None, age_s=5)))
    assert [f["state"] for f in live] == ["in_progress"]
    # Silent for longer than the lease: interrupted.
    silent = dict(lock, holder_alive=None, age_s=4000)
    assert dflash_findings(facts(deploy_lock=silent), 60, 1800)[0]["state"] == "interrupted"


def test_a_run_in_progress_is_the_one_finding_and_an_interrupted_one_is_not():
    """A cron verify beside a deploy saw the old trainer still stopping (`stale_process`) and
    the new release not yet recorded (`history`) beside the deploy in progress: the deploy's
    own work, named as drift. While a live run holds the lock, the run is the one finding."""
    holder = {"user": "u", "host": "ctl", "pid": 4242, "boot_id": "other-kernel"}
    lock = {"action": "deploy", "release": "v3", "phase": "launch", "holder": holder, "age_s": 5}
    # Mid-deploy: current already v3, its history line not yet written, a file not yet right.
    mid = {"current": dict(facts()["current"], release="v3",
                           manifest={"release": "v3", "tree_sha256": "t3"}),
           "files": {"changed": ["dflash/a.py"], "missing": [], "extra": []}}  # fmt: skip
    live = dflash_findings(facts(**mid, deploy_lock=dict(lock, holder_alive=None)))
    assert [f["kind"] for f in live] == ["release", "code"]
    assert [(f["kind"], f["state"]) for f in while_in_progress(live)] == [
        ("release", "in_progress")
    ]  # fmt: skip
    assert "verify again once it has ended" in while_in_progress(live)[0]["hint"]
    # Its holder dead: interrupted, and everything it left is named beside it.
    dead = dflash_findings(facts(**mid, deploy_lock=dict(lock, holder_alive=False)))
    assert while_in_progress(dead) == dead
    assert [(f["kind"], f["state"]) for f in dead] == [
        ("release", "interrupted"), ("code", "changed")
    ]  # fmt: skip
    # No lock: the findings as they are.
    assert while_in_progress(dflash_findings(facts(**mid))) == dflash_findings(facts(**mid))


def test_current_that_is_not_a_link_is_named():
    current = dict(facts()["current"], release=None, link=None, not_a_link=True)
    [finding] = dflash_findings(facts(current=current))
    assert finding["kind"] == "release" and "not a link" in finding["found"]
