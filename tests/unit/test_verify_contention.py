"""verify's `contention` finding (module_utils/dflash_contention.py) from facts documents shaped
as dflash_facts returns them, the sample of who takes the CPU (module_utils/dflash_cpu_top.py)
against real busy processes, and the figure in the Prometheus text and the JUnit report."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_contention import (
    contention_findings,
    contention_view,
    judge,
    wait_shares,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_cpu_top import cpu_consumers
from tests.helpers import REPO

_SPEC = importlib.util.spec_from_file_location(
    "dflash_contention_report_plugin",
    REPO / "action_plugins" / "dflash_verify_report.py",
)
assert _SPEC and _SPEC.loader
report_plugin = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report_plugin)

# Windows of 1000 tokens/s with the wait left out; as measured, 600-700: waited 30-40%.
BUSY = {"throughput_windows": [900.0, 700.0, 600.0, 650.0],
        "throughput_windows_unstarved": [1000.0, 1000.0, 1000.0, 1000.0]}  # fmt: skip
SAMPLE = {"seconds": 1.0, "cpus": 2, "others_cpu": 1.98,
          "top": [{"pid": 812, "name": "yes", "cpu": 0.99, "cmdline": "yes"},
                  {"pid": 813, "name": "yes", "cpu": 0.97, "cmdline": "yes"}]}  # fmt: skip


def status(**fields: object) -> dict:
    return {"run_id": "r1", "state": "running", "step": 900, **BUSY, **fields}


def facts(age_s: float = 600.0, sample: dict | None = SAMPLE, **fields: object) -> dict:
    proc = {"pid": 4242, "job": 4242, "age_s": age_s, "status": status(**fields)}
    return {
        "trainers": {"record": {"run_id": "r1"}, "processes": [proc]},
        "cpu_consumers": sample,
    }


def test_the_wait_share_of_each_window_is_what_the_measured_figure_lost():
    assert wait_shares(status()) == [0.3, 0.4, 0.35]
    # An older trainer writes no windows with the wait left out: nothing to judge by.
    assert wait_shares({"throughput_windows": [1.0, 2.0, 3.0]}) == []


def test_contention_needs_every_window_over_the_limit():
    assert judge(status(), 600.0, 0.25, 300)["contended"] is True
    # One window under the limit (a burst that passed) is no contention.
    assert judge(status(), 600.0, 0.32, 300)["contended"] is False
    one_calm = status(throughput_windows=[900.0, 700.0, 800.0, 650.0])
    view = judge(one_calm, 600.0, 0.25, 300)
    assert view["judged"] and not view["contended"]
    assert view["note"] == "judged over the last 3 windows: waited 20%-35% of the time"


@pytest.mark.parametrize(
    ("state", "age_s", "max_wait", "fields", "note"),
    [
        ("running", 600.0, 1.0, {}, "not judged: dflash_verify_max_cpu_wait is 1"),
        ("backoff", 600.0, 0.25, {}, "the trainer is backoff"),
        ("running", 120.0, 0.25, {}, "not judged before the trainer has run 300 s (up 120.0 s)"),
        ("running", 600.0, 0.25, {"throughput_windows_unstarved": None},
         "not judged: this trainer does not measure its wait for a CPU"),
        ("running", 600.0, 0.25,
         {"throughput_windows": [600.0], "throughput_windows_unstarved": [1000.0]},
         "too early to judge: 1 of 3 windows measured"),
    ],
)  # fmt: skip
def test_what_cannot_be_judged_says_why(state, age_s, max_wait, fields, note):
    view = judge(status(state=state, **fields), age_s, max_wait, 300)
    assert not view["judged"] and not view["contended"]
    assert view["note"].startswith(note)


def test_the_finding_names_the_shares_both_figures_and_who_took_the_cpu():
    [item] = contention_findings(facts(), 0.25, 300)
    assert item["kind"] == "contention" and item["pid"] == 4242
    assert item["expected"] == (
        "the trainer waits for a CPU at most 25% of its time (dflash_verify_max_cpu_wait)"
    )
    assert item["found"] == (
        "it waited 30%-40% of the time in each of its last 3 windows at step 900 (650 tokens/s "
        "as measured, 1000 with the wait left out); in a 1 s sample, of 2 CPUs, other processes "
        "took 1.98 CPU: pid 812 yes (0.99 CPU), pid 813 yes (0.97 CPU)"
    )
    assert "dflash_verify_max_cpu_wait" in item["hint"] and item["consumers"] == SAMPLE["top"]
    assert contention_findings(facts(age_s=10.0), 0.25, 300) == []
    assert contention_findings(facts(), 1.0, 300) == []


def test_a_container_that_sees_no_consumer_says_where_to_look():
    quiet = {"seconds": 1.0, "cpus": 2, "others_cpu": 0.02, "top": []}
    [item] = contention_findings(facts(sample=quiet), 0.25, 300)
    assert item["found"].endswith(
        "no process visible here took over 5% of a CPU in a 1 s sample (in a container, those "
        "of the node and other containers are not visible)"
    )


BUSY_LOOP = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n"
PARENT_OF_BUSY = (
    "import subprocess, sys\n"
    f"subprocess.run([sys.executable, '-c', {BUSY_LOOP!r}])\n"
)  # fmt: skip


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


@pytest.mark.slow
def test_the_sample_names_a_busy_process_and_leaves_the_trainers_out():
    """Real processes: a busy loop that is no trainer's, and a 'trainer' whose busy child runs
    under it. Only the first is named, with most of a CPU (on a loaded machine at least a
    tenth: the sample is one second)."""
    stray = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    trainer = subprocess.Popen([sys.executable, "-c", PARENT_OF_BUSY])
    try:
        deadline = time.monotonic() + 30
        while not _children(trainer.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        [busy_child] = _children(trainer.pid)
        sample = cpu_consumers({trainer.pid}, seconds=1.0)
    finally:
        for proc in (stray, trainer):
            proc.kill()
            proc.wait()
    named = {row["pid"]: row for row in sample["top"]}
    assert stray.pid in named and named[stray.pid]["cpu"] >= 0.1, sample
    assert named[stray.pid]["name"] == "python" or "python" in named[stray.pid]["cmdline"]
    assert trainer.pid not in named and busy_child not in named, sample
    assert sample["cpus"] >= 1 and sample["others_cpu"] >= named[stray.pid]["cpu"]


def test_the_share_reaches_the_metrics_and_the_junit_case():
    view = contention_view(facts(), 0.25, 300)
    result = {"verdict": "drift", "findings": contention_findings(facts(), 0.25, 300),
              "contention": view}  # fmt: skip
    text = report_plugin.prometheus_text({"h1": result}, now=0.0).decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("dflash_trainer_cpu_wait_ratio", (("host", "h1"),))] == 0.35
    assert values[("dflash_verify_findings", (("host", "h1"), ("kind", "contention")))] == 1
    assert values[("dflash_verify_check_applicable", (("check", "contention"), ("host", "h1")))]
    suite = ElementTree.fromstring(report_plugin.junit_xml({"h1": result}))
    case = suite.find("testcase")
    assert case is not None
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["cpu_wait_ratio"] == "0.35"
    failure = case.find("failure")
    assert failure is not None and "contention" in (failure.text or "")
