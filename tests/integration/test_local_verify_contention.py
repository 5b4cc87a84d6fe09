"""verify.yml's `contention` finding against a real trainer on the local target, made to wait for
a CPU for real: after a healthy deploy, its threads and a busy process are pinned to one CPU,
so the trainer gets at most half of it whatever else the machine runs (a loaded machine only
lengthens the wait). verify must name the wait and the busy process by pid, and carry the
share in the Prometheus text and the JUnit report."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_contention import wait_shares
from tests.integration.conftest import TRAINER_ARGS, is_trainer, status_of

MAX_WAIT = 0.25
# Short windows (5 steps), no idle between steps: a trainer that sleeps between steps wins
# the CPU back at each wake-up (the scheduler favours a task that slept) and barely waits.
ARGS = dict(TRAINER_ARGS, sleep_per_step=0, throughput_window=5)
# A busy loop of 10 minutes at most, at nice -5 where it may (root: three times a plain
# process's weight, three quarters of its CPU). Holding a third of a CPU or more it is among
# the five the sample names on a 2-CPU machine whatever else runs: at most four others can
# hold more.
BUSY = (
    "import contextlib, os, time\n"
    "with contextlib.suppress(OSError):\n"
    "    os.setpriority(os.PRIO_PROCESS, 0, -5)\n"
    "end = time.monotonic() + 600\n"
    "while time.monotonic() < end: pass\n"
)


def trainer_threads(root: Path) -> list[int]:
    """Every thread of every process of the root's trainer."""
    found = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        if is_trainer(pid, root):
            with contextlib.suppress(OSError):
                found += [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    return found


@contextlib.contextmanager
def sharing_one_cpu(root: Path) -> Iterator[list[int]]:
    """The trainer's threads and a busy process on one CPU; the busy process's pid."""
    cpu, every = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY])]
    threads = trainer_threads(root)
    try:
        for pid in [p.pid for p in busy] + threads:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(pid, {cpu})
        yield [p.pid for p in busy]
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, every)


def wait_contended(root: Path, timeout: float) -> list[float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shares = wait_shares(status_of(root) or {})
        if len(shares) == 3 and min(shares) > 1.4 * MAX_WAIT:  # ~50-75% when pinned
            return shares
        time.sleep(0.5)
    raise AssertionError(f"the trainer's windows never showed the wait: {status_of(root)}")


def test_a_trainer_waiting_for_a_cpu_is_named_with_who_holds_it(
    deploy, playbook, target_root: Path, tmp_path: Path
):
    assert deploy("v1", dflash_trainer_args=ARGS).rc == 0
    verify = lambda: playbook(  # noqa: E731
        "verify.yml", dflash_verify_max_cpu_wait=MAX_WAIT, dflash_verify_contention_after=0
    )
    with sharing_one_cpu(target_root) as busy:
        wait_contended(target_root, 240)
        run = verify()
    assert run.rc != 0, run.output
    host = run.report["hosts"]["local"]
    [item] = [f for f in host["findings"] if f["kind"] == "contention"]
    assert min(item["shares"]) > MAX_WAIT, item
    named = {row["pid"] for row in item["consumers"]}
    assert set(busy) <= named, item
    for pid in busy:
        assert f"pid {pid} python" in item["found"], item["found"]
    assert item["found"].startswith("it waited "), item["found"]
    assert host["checks"]["contention"].startswith("judged over the last 3 windows: waited ")
    print(item["found"])

    prom = (tmp_path / "reports" / "verify.prom").read_text()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(prom)
        for s in family.samples
    }
    assert values[("dflash_verify_findings", (("host", "local"), ("kind", "contention")))] == 1
    assert values[("dflash_trainer_cpu_wait_ratio", (("host", "local"),))] > MAX_WAIT
    suite = ElementTree.parse(tmp_path / "reports" / "verify.junit.xml").getroot()
    case = next(suite.iter("testcase"))
    figures = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert float(figures["cpu_wait_ratio"]) > MAX_WAIT
    assert "contention" in (case.find("failure").get("message") or "")
