"""history.yml -e dflash_history_html=true over hosts of one job and one on its own, from
history.jsonl files written here (no deploy): a page per host and one for the job listing its
hosts, a failed line shown without a figure, a truncated line reported and not fatal, and
check mode writing the same pages."""

from __future__ import annotations

import json

import yaml

from tests.helpers import run_playbook
from tests.unit.test_report import HISTORY


def test_a_jobs_pages_from_written_histories(tmp_path):
    hosts = {}
    for name in ("ct-1", "ct-2", "solo"):
        root = tmp_path / name
        root.mkdir()
        lines = [json.dumps(entry) for entry in HISTORY]
        if name == "ct-2":
            lines.append('{"time": "2026-12-04T14:0')  # a writer cut short
        (root / "history.jsonl").write_text("\n".join(lines) + "\n")
        hosts[name] = {"dflash_root": str(root), "dflash_job": "" if name == "solo" else "llama"}
    inventory = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local",
             "ansible_python_interpreter": "{{ ansible_playbook_python }}"}  # fmt: skip
    inventory.write_text(yaml.safe_dump(
        {"all": {"children": {"dflash_targets": {"hosts": hosts, "vars": local}}}}
    ))  # fmt: skip
    for check, out in ((False, tmp_path / "reports"), (True, tmp_path / "checked")):
        run = run_playbook(
            "history.yml",
            {"dflash_history_html": True, "dflash_history_html_dir": str(out),
             "dflash_history_json": str(out / "history.json"),
             "dflash_verify_json": str(tmp_path / "none.json")},
            inventory=inventory, check=check,
        )  # fmt: skip
        assert run.rc == 0 and {h: r["changed"] for h, r in run.recap.items()} == dict.fromkeys(
            hosts, 0
        ), run.output
        assert sorted(p.name for p in out.glob("report*")) == [
            "report-ct-1.html", "report-ct-2.html", "report-job-llama.html",
            "report-solo.html", "report.json",
        ]  # fmt: skip
    job = (tmp_path / "reports" / "report-job-llama.html").read_text()
    assert "data-host='ct-1'" in job and "data-host='ct-2'" in job and "'solo'" not in job
    models = json.loads((tmp_path / "reports" / "report.json").read_text())["hosts"]
    assert models["ct-2"]["damaged"][0]["line"] == 5
    assert [d["number"] for d in models["ct-1"]["drops"]] == [2]
    page = (tmp_path / "reports" / "report-ct-2.html").read_text()
    assert "Damaged lines of history.jsonl" in page and "no tokens/s" in page
