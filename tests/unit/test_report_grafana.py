"""docs/grafana-dashboard.json against the metrics verify.yml writes: it is a dashboard Grafana
imports (unique panel ids, the Prometheus data source and the hosts as variables), it draws
every metric docs/verify.md lists for watching a run, and it names no metric the Prometheus
report does not write (action_plugins/dflash_verify_report.py)."""

from __future__ import annotations

import json
import re

from tests.helpers import REPO

DASHBOARD = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
WRITER = (REPO / "action_plugins/dflash_verify_report.py").read_text()
DRAWN = {
    "dflash_trainer_tokens_per_second", "dflash_trainer_reference_tokens_per_second",
    "dflash_trainer_throughput_ratio", "dflash_trainer_throughput_band", "dflash_verify_findings",
    "dflash_trainer_step", "dflash_trainer_status_age_seconds", "dflash_trainer_stage_seconds",
    "dflash_goodput_ratio", "dflash_verify_verdict", "dflash_trainer_restarts",
}  # fmt: skip


def expressions() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]


def test_the_dashboard_draws_every_metric_of_a_run_and_only_written_ones():
    named = {m for expr in expressions() for m in re.findall(r"\bdflash_\w+", expr)}
    assert sorted(DRAWN - named) == []
    written = set(re.findall(r'gauge\(\s*"(dflash_\w+)"', WRITER))
    assert sorted(named - written) == []


def test_the_dashboard_imports_with_its_variables():
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "host" in variables["host"]["definition"]
    for panel in DASHBOARD["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all('host=~"$host"' in target["expr"] for target in panel["targets"])
