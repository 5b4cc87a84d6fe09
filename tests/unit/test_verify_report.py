"""verify's reports (action_plugins/dflash_verify_report.py): the JUnit
report's per-host figures and the Prometheus metrics, read back with Prometheus' own parser."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ElementTree

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import REPO

_SPEC = importlib.util.spec_from_file_location(
    "dflash_verify_report",
    REPO / "action_plugins" / "dflash_verify_report.py",
)
report_plugin = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report_plugin)

DRIFTED = {
    "verdict": "drift",
    "release": "v2",
    "findings": [
        {"kind": "throughput", "expected": "...", "found": "...", "hint": "...", "pid": 4242},
        {"kind": "gpu", "expected": "...", "found": "...", "hint": "...", "gpu": 1},
        {"kind": "gpu", "expected": "...", "found": "...", "hint": "...", "pid": 77},
    ],
    "trainer": {
        "pid": 4242,
        "state": "running",
        "step": 812,
        "age_s": 310.5,
        "heartbeat_age_s": 1.2,
    },
    "throughput": {
        "tokens_per_s": 104.5,
        "health_check": {"number": 2, "release": "v2", "tokens_per_s": 1100.0},
        "fastest": {"number": 1, "release": "v1", "tokens_per_s": 1250.0},
        "ratios": {"health_check": 0.095, "fastest": 0.084},
        "stages": {
            "drafter_backward": 1.9,
            "drafter_forward": 0.6,
            "transfer": None,
            "step": 2.6,
        },
        "slowest_stage": {"name": "drafter_backward", "seconds": 1.9},
        "judged": True,
    },
    "gpu": {"applies": True, "gpus": [0, 1], "pids": "here"},
    "checks": {"throughput": "judged over the last 20 steps", "gpu": "checked GPUs 0,1"},
}
CPU_OK = {
    "verdict": "ok",
    "release": "v1",
    "findings": [],
    "trainer": {"pid": 9, "state": "running", "step": 30, "age_s": 12.0, "heartbeat_age_s": 0.4},
    "throughput": {
        "tokens_per_s": 900.0,
        "health_check": None,
        "fastest": None,
        "ratios": {},
        "stages": None,
        "judged": False,
    },
    "gpu": {"applies": False, "why": "no nvidia-smi on the target (a CPU target)"},
    "checks": {
        "throughput": "too early to judge: 4 of 20 steps measured",
        "gpu": "not applicable: no nvidia-smi on the target (a CPU target)",
    },
}
REPORT = {"gpu-node-1": DRIFTED, "ct101": CPU_OK, "ct102": {"verdict": "unreachable"}}


def samples(text: str) -> dict[tuple, float]:
    """(metric name, sorted labels) -> value, parsed as Prometheus parses the file."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_metrics_parse_and_hold_the_verdicts_findings_and_figures():
    text = report_plugin.prometheus_text(REPORT, now=1796120000.0).decode()
    got = samples(text)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert value("dflash_verify_timestamp_seconds") == 1796120000.0
    assert value("dflash_verify_verdict", host="gpu-node-1", verdict="drift") == 1
    assert value("dflash_verify_verdict", host="gpu-node-1", verdict="ok") == 0
    assert value("dflash_verify_verdict", host="ct102", verdict="unreachable") == 1
    # Every kind is a series, 0 where absent, so an alert needs no absent().
    assert value("dflash_verify_findings", host="gpu-node-1", kind="gpu") == 2
    assert value("dflash_verify_findings", host="gpu-node-1", kind="throughput") == 1
    assert value("dflash_verify_findings", host="ct101", kind="throughput") == 0
    assert value("dflash_trainer_tokens_per_second", host="gpu-node-1") == 104.5
    assert value("dflash_trainer_reference_tokens_per_second", host="gpu-node-1",
                 reference="fastest") == 1250.0  # fmt: skip
    assert value("dflash_trainer_throughput_ratio", host="gpu-node-1",
                 reference="health_check") == 0.095  # fmt: skip
    assert value("dflash_trainer_stage_seconds", host="gpu-node-1", stage="drafter_backward") == 1.9
    assert value("dflash_trainer_step", host="gpu-node-1") == 812
    assert value("dflash_trainer_status_age_seconds", host="ct101") == 0.4
    # What could not be judged is 0, not silence: the CPU target's gpu check does not apply.
    assert value("dflash_verify_check_applicable", host="ct101", check="gpu") == 0
    assert value("dflash_verify_check_applicable", host="gpu-node-1", check="gpu") == 1
    assert value("dflash_verify_check_applicable", host="ct101", check="throughput") == 0
    # No figure, no series (not a 0 that would read as a stopped trainer).
    missing = ("dflash_trainer_throughput_ratio", (("host", "ct101"), ("reference", "fastest")))
    assert missing not in got
    assert not any(key[0] == "dflash_trainer_step" and ("host", "ct102") in key[1] for key in got)


def test_the_junit_case_of_each_host_carries_its_figures_and_checks():
    suite = ElementTree.fromstring(report_plugin.junit_xml(REPORT))
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    figures = {p.get("name"): p.get("value") for p in cases["gpu-node-1"].iter("property")}
    assert figures == {
        "tokens_per_s": "104.5",
        "health_check_tokens_per_s": "1100.0",
        "fastest_tokens_per_s": "1250.0",
        "slowest_stage": "drafter_backward 1.9 s",
        "step": "812",
        "trainer_age_s": "310.5",
        "status_age_s": "1.2",
        "check.throughput": "judged over the last 20 steps",
        "check.gpu": "checked GPUs 0,1",
    }
    assert cases["gpu-node-1"].find("failure").get("message") == "3 finding(s): throughput, gpu"
    assert "gpu GPU 1: expected" in cases["gpu-node-1"].find("failure").text
    cpu = {p.get("name"): p.get("value") for p in cases["ct101"].iter("property")}
    assert cpu["check.gpu"] == "not applicable: no nvidia-smi on the target (a CPU target)"
    assert cases["ct102"].find("properties") is None


def test_a_job_gets_a_test_case_and_a_verdict_series():
    jobs = {
        "j1": {"verdict": "broken", "findings": [
            {"kind": "job_trainer", "host": "ct201", "expected": "a trainer of the job",
             "found": "no trainer", "hint": "ansible-playbook deploy.yml"}]},
        "j2": {"verdict": "ok", "findings": []},
    }  # fmt: skip
    suite = ElementTree.fromstring(report_plugin.junit_xml({"ct200": {"verdict": "ok"}}, jobs))
    assert (suite.get("tests"), suite.get("failures")) == ("3", "1")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    failure = cases["j1"].find("failure")
    assert failure.get("message") == "job broken: 1 finding(s)"
    assert "job_trainer ct201: expected a trainer of the job, found no trainer" in failure.text
    assert cases["j2"].find("failure") is None
    text = report_plugin.prometheus_text({}, 0.0, jobs).decode()
    series = {
        (sample.labels["job"], sample.labels["verdict"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "dflash_job_verdict"
        for sample in family.samples
    }
    assert series[("j1", "broken")] == 1 and series[("j1", "ok")] == 0
    assert series[("j2", "ok")] == 1
