# Writes verify.yml's JSON, JUnit and Prometheus reports on the controller, inside the
# controller's own process: no module run, so they cost milliseconds instead of a round trip.
from __future__ import annotations

import json
import os
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
---
module: dflash_verify_report
short_description: Write verify.yml's JSON, JUnit and Prometheus reports on the controller
description:
  - Runs on the controller only (an action plugin, no module is sent anywhere). Creates the
    reports' folders and writes every file atomically (a temp file in the same folder, then a
    rename, as node_exporter's textfile collector needs). The reports are outputs of the
    audit, not changes to a target, so it always reports C(changed=false) and writes in check
    mode too.
options:
  jobs:
    description:
      - job -> its verdict (ok, stopped, drift, broken), C(hosts), C(release), C(rdzv_id),
        C(world_size), C(nodes) and C(findings), from filter_plugins/dflash_job_verify.py.
    type: dict
    default: {}
  report:
    description:
      - host -> C(verdict) (ok, stopped, drift, unreachable), C(release), C(findings), and the
        figures C(trainer), C(supervision), C(compile_cache), C(throughput), C(gpu) and
        C(checks) of filter_plugins/dflash_verify_throughput.py.
    type: dict
    required: true
  json_path:
    description: "Where the JSON report goes: an object with the keys C(hosts) and C(jobs)."
    type: path
    required: true
  junit_path:
    description: Where the JUnit report goes (one test case per host, its figures as properties).
    type: path
    required: true
  prom_path:
    description:
      - Where the Prometheus text-format metrics go (a C(.prom) file for node_exporter's
        textfile collector); none when left out.
    type: path
attributes:
  check_mode:
    support: full
    description: Writes the reports in check mode too; they change no target.
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Write the reports
  dflash_verify_report:
    report: "{{ dflash_verify_report }}"
    json_path: reports/verify.json
    junit_path: reports/verify.junit.xml
    prom_path: /var/lib/prometheus/node-exporter/dflash.prom
  run_once: true
"""

RETURN = r"""
json_path:
  description: The JSON report written.
  type: str
  returned: success
junit_path:
  description: The JUnit report written.
  type: str
  returned: success
prom_path:
  description: The Prometheus metrics written.
  type: str
  returned: when prom_path is given
"""

# Every finding kind (docs/verify.md): each is a series, 0 when absent, so an alert
# on one kind needs no `absent()`.
KINDS = ("code", "release", "stale_process", "duplicate_trainer", "not_running",
         "heartbeat_stale", "hung", "trainer_down", "supervisor_gone", "crash_loop",
         "environment", "run_script",
         "cache", "throughput", "contention", "gpu", "data", "history", "trainer_record",
         "checkpoint", "disk")  # fmt: skip
# The causes of lost time that supervisor.json's goodput names
# (dflash/supervision/goodput.py CAUSES).
BADPUT = ("startup", "checkpoint", "lost", "hang", "down")
# `stopped`: stop.yml stopped the trainer on purpose, nothing drifted (verify exits 0).
VERDICTS = ("ok", "stopped", "drift", "unreachable")
JOB_VERDICTS = ("ok", "stopped", "drift", "broken")
REFERENCES = ("health_check", "fastest")


def _what(item: dict) -> str:
    for key in ("path", "package", "pid"):
        if item.get(key) not in (None, ""):
            return str(item[key])
    return f"GPU {item['gpu']}" if item.get("gpu") is not None else ""


def _failure(
    case: ElementTree.Element, message: str, findings: list[dict], what: Callable[[dict], str]
) -> None:
    """A <failure> whose text has a line per finding: kind, what, expected, found, the fix."""
    failure = ElementTree.SubElement(case, "failure", message=message)
    failure.text = "\n" + "".join(
        f"{item.get('kind')} {what(item)}: expected {item.get('expected')}, "
        f"found {item.get('found')}; fix: {item.get('hint')}\n"
        for item in findings
    )


def junit_xml(report: dict[str, dict], jobs: dict[str, dict] | None = None) -> bytes:
    """One <testcase> per host: a <failure> listing the findings of a drifted host, an <error>
    for one that could not be read; one per job, failed unless its verdict is ok or stopped."""
    jobs = jobs or {}
    verdicts = [result.get("verdict") for result in report.values()]
    failed_jobs = sum(job.get("verdict") not in ("ok", "stopped") for job in jobs.values())
    suite = ElementTree.Element(
        "testsuite",
        name="dflash-verify",
        tests=str(len(report) + len(jobs)),
        failures=str(verdicts.count("drift") + failed_jobs),
        errors=str(verdicts.count("unreachable")),
    )
    for host, result in sorted(report.items()):
        case = ElementTree.SubElement(suite, "testcase", classname="dflash.verify", name=host)
        figures = host_figures(result)
        if figures:
            properties = ElementTree.SubElement(case, "properties")
            for name, value in figures.items():
                ElementTree.SubElement(properties, "property", name=name, value=str(value))
        if result.get("verdict") == "unreachable":
            ElementTree.SubElement(
                case, "error", message=f"{host} could not be read (unreachable or failed)"
            )
        elif result.get("verdict") == "drift":
            findings = result.get("findings") or []
            kinds = list(dict.fromkeys(str(item.get("kind")) for item in findings))
            _failure(case, f"{len(findings)} finding(s): {', '.join(kinds)}", findings, _what)
    for name, job in sorted(jobs.items()):
        case = ElementTree.SubElement(suite, "testcase", classname="dflash.verify.job", name=name)
        if job.get("verdict") not in ("ok", "stopped"):
            findings = job.get("findings") or []
            message = f"job {job.get('verdict')}: {len(findings)} finding(s)"
            _failure(case, message, findings, lambda item: str(item.get("host")))
    ElementTree.indent(suite)
    return ElementTree.tostring(suite, encoding="UTF-8", xml_declaration=True) + b"\n"


def cpu_wait(result: dict) -> float | None:
    """The share of its time the trainer waited for a CPU in its newest window."""
    shares = (result.get("contention") or {}).get("shares") or []
    return shares[-1] if shares else None


def host_figures(result: dict) -> dict[str, Any]:
    """The figures of a host's test case: tokens/s now, at the health check and of the
    fastest comparable deployment, the slowest stage, the trainer's step and age, and what
    each check could look at."""
    trainer = result.get("trainer") or {}
    speed = result.get("throughput") or {}
    slowest = speed.get("slowest_stage") or {}
    figures: dict[str, Any] = {
        "tokens_per_s": speed.get("tokens_per_s"),
        "health_check_tokens_per_s": (speed.get("health_check") or {}).get("tokens_per_s"),
        "fastest_tokens_per_s": (speed.get("fastest") or {}).get("tokens_per_s"),
        "slowest_stage": f"{slowest['name']} {slowest['seconds']} s" if slowest else None,
        "step": trainer.get("step"),
        "trainer_age_s": trainer.get("age_s"),
        "status_age_s": trainer.get("heartbeat_age_s"),
        "restarts": ((result.get("supervision") or {}).get("restarts") or {}).get("count"),
        "goodput_ratio": ((result.get("supervision") or {}).get("goodput") or {}).get("ratio"),
        "cpu_wait_ratio": cpu_wait(result),
    }
    figures.update({f"check.{name}": text for name, text in (result.get("checks") or {}).items()})
    return {name: value for name, value in figures.items() if value is not None}


def prometheus_text(report: dict[str, dict], now: float, jobs: dict | None = None) -> bytes:
    """The report as Prometheus text-format metrics, one series per host (and job) and label."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()

    def gauge(name: str, text: str, *labels: str) -> Gauge:
        return Gauge(name, text, ("host", *labels), registry=registry)

    Gauge(
        "dflash_verify_timestamp_seconds",
        "When verify.yml wrote this report (unix time).",
        registry=registry,
    ).set(now)
    verdict = gauge(
        "dflash_verify_verdict", "1 for the host's verdict, 0 for the others.", "verdict"
    )
    findings = gauge("dflash_verify_findings", "Findings of each kind on the host.", "kind")
    applies = gauge(
        "dflash_verify_check_applicable",
        "1 when the check could judge the host (gpu: nvidia-smi and GPUs in the "
        "layout; throughput: a running trainer with a full window; contention: one that "
        "has run dflash_verify_contention_after seconds with 3 windows).",
        "check",
    )
    speed = gauge("dflash_trainer_tokens_per_second", "The running trainer's tokens/s now.")
    reference = gauge(
        "dflash_trainer_reference_tokens_per_second",
        "tokens/s of this deployment's health check and of the fastest healthy "
        "deployment of the same layout, shape and data.",
        "reference",
    )
    ratio = gauge(
        "dflash_trainer_throughput_ratio",
        "The judged tokens/s (the fastest of the last windows) over each reference.",
        "reference",
    )
    band = gauge(
        "dflash_trainer_throughput_band",
        "The share of each reference the judged tokens/s must reach (verify's band).",
        "reference",
    )
    waited = gauge(
        "dflash_trainer_cpu_wait_ratio",
        "Share of its newest window the trainer waited for a CPU other processes held.",
    )
    step = gauge("dflash_trainer_step", "The running trainer's training step.")
    age = gauge("dflash_trainer_status_age_seconds", "Age of the trainer's status.json.")
    stage = gauge("dflash_trainer_stage_seconds", "Seconds per step of each stage now.", "stage")
    restarts = gauge("dflash_trainer_restarts", "Restarts of the current run by its supervisor.")
    goodput = gauge(
        "dflash_goodput_ratio",
        "Share of the current run's wall time spent on training steps that were kept.",
    )
    badput = gauge(
        "dflash_badput_seconds", "Seconds of the current run's wall time lost, by cause.", "cause"
    )
    for host, result in sorted(report.items()):
        for name in VERDICTS:
            verdict.labels(host, name).set(int(result.get("verdict") == name))
        kinds = [str(item.get("kind")) for item in result.get("findings") or []]
        for kind in dict.fromkeys((*KINDS, *kinds)):
            findings.labels(host, kind).set(kinds.count(kind))
        throughput = result.get("throughput") or {}
        applies.labels(host, "throughput").set(int(bool(throughput.get("judged"))))
        applies.labels(host, "contention").set(
            int(bool((result.get("contention") or {}).get("judged")))
        )
        applies.labels(host, "gpu").set(int(bool((result.get("gpu") or {}).get("applies"))))
        if throughput.get("tokens_per_s") is not None:
            speed.labels(host).set(throughput["tokens_per_s"])
        for name in REFERENCES:
            figure = (throughput.get(name) or {}).get("tokens_per_s")
            if figure is not None:
                reference.labels(host, name).set(figure)
            if (throughput.get("ratios") or {}).get(name) is not None:
                ratio.labels(host, name).set(throughput["ratios"][name])
            if (throughput.get("bands") or {}).get(name) is not None:
                band.labels(host, name).set(throughput["bands"][name])
        if cpu_wait(result) is not None:
            waited.labels(host).set(cpu_wait(result))
        for name, seconds in (throughput.get("stages") or {}).items():
            if seconds is not None:
                stage.labels(host, name).set(seconds)
        trainer = result.get("trainer") or {}
        if trainer.get("step") is not None:
            step.labels(host).set(trainer["step"])
        if trainer.get("heartbeat_age_s") is not None:
            age.labels(host).set(trainer["heartbeat_age_s"])
        supervision = result.get("supervision") or {}
        if supervision:
            restarts.labels(host).set((supervision.get("restarts") or {}).get("count") or 0)
        good = supervision.get("goodput") or {}
        if good.get("ratio") is not None:
            goodput.labels(host).set(good["ratio"])
            for cause in BADPUT:
                badput.labels(host, cause).set((good.get("badput_s") or {}).get(cause) or 0)
    job_verdict = Gauge(
        "dflash_job_verdict", "1 for the job's verdict, 0 for the others.", ("job", "verdict"),
        registry=registry,
    )  # fmt: skip
    for name, job in sorted((jobs or {}).items()):
        for value in JOB_VERDICTS:
            job_verdict.labels(name, value).set(int(job.get("verdict") == value))
    return generate_latest(registry)


def write_atomically(path: str, data: bytes) -> None:
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("report", "jobs", "json_path", "junit_path", "prom_path"))
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(
            argument_spec={
                "report": {"type": "dict", "required": True},
                "jobs": {"type": "dict", "default": {}},
                "json_path": {"type": "path", "required": True},
                "junit_path": {"type": "path", "required": True},
                "prom_path": {"type": "path"},
            }
        )
        report, jobs = args["report"], args["jobs"]
        try:
            document = {"hosts": report, "jobs": jobs}
            write_atomically(
                args["json_path"], (json.dumps(document, indent=4, sort_keys=True) + "\n").encode()
            )
            write_atomically(args["junit_path"], junit_xml(report, jobs))
            if args["prom_path"]:
                write_atomically(args["prom_path"], prometheus_text(report, time.time(), jobs))
                result["prom_path"] = args["prom_path"]
        except OSError as err:
            raise AnsibleActionFail(f"cannot write the verify reports: {err}") from err
        except ImportError as err:
            raise AnsibleActionFail(
                f"cannot write {args['prom_path']}: {err}; install prometheus-client into the "
                "controller's Python (it is in pyproject.toml) or set dflash_verify_prom: ''"
            ) from err
        result.update(changed=False, json_path=args["json_path"], junit_path=args["junit_path"])
        return result
