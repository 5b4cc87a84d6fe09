"""verify's findings from a facts document (filter_plugins/dflash_verify.py)."""

from __future__ import annotations

from dflash_filters import dflash_findings, dflash_report_lines


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
        "history": [{"release": "v1", "tree_sha256": "t1"}, {"release": "v2", "tree_sha256": "t2"}],
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
    switched = facts(history=[{"release": "v2", "tree_sha256": "t2"}, {"release": "v1"}])
    [finding] = dflash_findings(switched)
    assert finding["expected"] == "v1" and finding["found"] == "v2"
