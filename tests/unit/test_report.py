"""history.yml's report over synthetic history.jsonl lines: a drop beyond verify's band lists
what changed (the code file, the env pin, the trainer flag) from the deployment before it, a
later recovery is no drop, a failed deployment is shown without a figure (never as zero), a
noisy reference widens the band, a job's page lists its hosts, and train.log's steps become
the run's series."""

from __future__ import annotations

import importlib.util
import json
import re

# As the controller's plugins import it, so that tests/integration/test_local_report_browser.py
# builds its page from these histories too.
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_report import (
    report_data,
    step_series,
)
from tests.helpers import REPO

_SPEC = importlib.util.spec_from_file_location(
    "dflash_report_filters", REPO / "filter_plugins" / "dflash_report.py"
)
report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report)


def line(release: str, tokens_per_s: float | None, *, hour: int, torch: str = "2.11.0+cu128",
         result: str = "healthy", sleep: float = 0.0, spread: float = 0.02) -> dict:  # fmt: skip
    return {
        "time": f"2026-12-04T{hour:02d}:00:00+00:00",
        "action": "deploy",
        "release": release,
        "tree_sha256": f"tree-{release}",
        "lock_id": f"lock-{torch}",
        "lock": {"torch": torch, "wheels": {"numpy": "2.3.0"}},
        "run_sh_sha256": f"run-{sleep}",
        "run_sh": {"layout": {"mode": "cpu"}, "trainer_args": {"sleep_per_step": sleep}},
        "run_sh_text": f"#!/bin/sh\nexec torchrun -m dflash.train --sleep-per-step {sleep}\n",
        "result": result,
        "tokens_per_s": tokens_per_s,
        "step_spread": spread,
        "stages": {"target_forward": 0.1, "drafter_backward": 0.2, "step": 0.35},
        "run_id": f"run-{release}" if tokens_per_s else None,
    }


MANIFESTS = {
    release: {"release": release, "tree_sha256": f"tree-{release}",
              "files": {"dflash/model.py": model, "dflash/train.py": "same"}}
    for release, model in (("v1", "a"), ("v2", "b"), ("v3", "a"), ("v4", "a"))
}  # fmt: skip
TEXTS = {("v1", "dflash/model.py"): b"LAYERS = 5\n", ("v2", "dflash/model.py"): b"LAYERS = 6\n"}


def model_of(history: list[dict], runs: dict | None = None, verify: dict | None = None) -> dict:
    data = report_data(history, MANIFESTS, lambda r, p: TEXTS.get((r, p)), runs or {}, 0.8)
    data.update(current=history[-1]["release"], damaged=[])
    return report.report_model(data, "gpu-ct-1", 0.8, verify)


# A slower release (other model code, torch +cu130, a sleep per step), then a failed one, then
# a faster one again.
HISTORY = [
    line("v1", 20000, hour=10),
    line("v2", 9000, hour=11, torch="2.11.0+cu130", sleep=0.05),
    line("v3", None, hour=12, result="rolled_back"),
    line("v4", 19800, hour=13),
]


def test_a_drop_lists_the_changed_file_the_pin_and_the_flag_and_a_recovery_is_no_drop():
    model = model_of(HISTORY)
    assert [(d["number"], d["reference"], d["ratio"], d["band"]) for d in model["drops"]] == [
        (2, 1, 0.45, 0.8)
    ]
    side = model["drops"][0]["previous"]
    assert side["files"]["changed"] == ["dflash/model.py"]
    assert "+LAYERS = 6" in side["files"]["text"]["dflash/model.py"]
    changes = {(c["section"], c["name"]): (c["from"], c["to"]) for c in side["changes"]}
    assert changes[("environment", "torch")] == ("2.11.0+cu128", "2.11.0+cu130")
    assert changes[("run_sh", "trainer_args.sleep_per_step")] == (0.0, 0.05)
    assert "+exec torchrun -m dflash.train --sleep-per-step 0.05" in side["run_sh_text"]
    page = report.report_html(model)
    drop = page.split('id="drop-2"', 1)[1].split("</section>", 1)[0]
    assert 'href="#drop-2-previous-dflash-model-py">dflash/model.py</a>' in drop
    assert "env pins: <code>torch 2.11.0+cu128 -&gt; 2.11.0+cu130</code>" in drop
    assert "trainer flags: <code>trainer_args.sleep_per_step 0.0 -&gt; 0.05</code>" in drop
    assert 'id="drop-2-previous-dflash-model-py"' in page  # the diff text it links to


def test_the_fastest_comparable_is_a_second_side_when_it_is_not_the_one_before():
    history = [line("v1", 20000, hour=10), line("v2", 17000, hour=11),
               line("v3", 8000, hour=12, torch="2.11.0+cu130")]  # fmt: skip
    (drop,) = model_of(history)["drops"]
    assert (drop["number"], drop["reference"]) == (3, 2)
    assert (drop["fastest"]["from"]["number"], drop["fastest"]["to"]["number"]) == (1, 3)


def test_a_noisy_reference_widens_the_band_as_verify_does():
    noisy = [line("v1", 20000, hour=10, spread=0.3), line("v2", 14000, hour=11)]
    # band = max(0.5, min(0.8, 1 - 1.25 x 0.3)) = 0.625: x0.7 is within the noise.
    assert model_of(noisy)["drops"] == []
    quiet = [line("v1", 20000, hour=10, spread=0.02), line("v2", 14000, hour=11)]
    assert [d["band"] for d in model_of(quiet)["drops"]] == [0.8]


def points(page: str, group: str) -> int:
    """How many markers the figure's group (an SVG <g id=...>) holds."""
    found = re.search(rf'<g id="{group}">(.*?)</g>', page, re.DOTALL)
    return found[1].count("<use ") if found else 0


def test_a_failed_deployment_is_shown_without_a_figure_not_as_zero():
    page = report.report_html(model_of(HISTORY))
    assert points(page, "dflash-points-deploy") == 3
    assert points(page, "dflash-points-unrated") == 1  # on the strip under the axis, labelled
    row = re.search(r"<tr data-number='3'>(.*?)</tr>", page)[1]
    assert "rolled_back" in row and "no tokens/s" in row and ">0<" not in row
    data = json.loads(re.search(r'id="dflash-report-data">(.*?)</script>', page)[1])
    assert [d["tokens_per_s"] for d in data["deployments"]] == [20000, 9000, None, 19800]


def test_damaged_lines_and_an_unreachable_host_are_reported_not_fatal():
    data = report_data(HISTORY, MANIFESTS, lambda r, p: None, {}, 0.8)
    data.update(current="v4", damaged=[{"line": 5, "bytes": 17, "text": '{"time": "2026-'}])
    page = report.report_html(report.report_model(data, "gpu-ct-1"))
    assert "Damaged lines of history.jsonl" in page and "line 5 (17 bytes)" in page
    gone = report.report_model(None, "gpu-ct-2")
    assert "did not answer" in report.report_html(gone)


def test_verify_verdict_goodput_and_stages_are_on_the_page():
    runs = {"run-v4": {"supervisor": {"goodput": {"ratio": 0.972}, "restarts": {"count": 1}},
                       "status": {"compile_cache": {"started_warm": True}}}}  # fmt: skip
    verify = {
        "hosts": {
            "gpu-ct-1": {
                "verdict": "drift",
                "release": "v4",
                "findings": [
                    {
                        "kind": "throughput",
                        "expected": ">= 0.8 x 19800",
                        "found": "4100",
                        "hint": "diff",
                    }
                ],
            }
        }
    }
    page = report.report_html(model_of(HISTORY, runs, verify))
    assert "goodput of its run: <b>97.2%</b>" in page
    assert "<span class='verdict drift'>drift</span>" in page and "&gt;= 0.8 x 19800" in page
    assert "outside the timed stages" in page and "drafter_backward" in page
    row = re.search(r"<tr data-number='4'>(.*?)</tr>", page)[1]
    assert "<td>warm</td>" in row and "<td>1</td>" in row
    data = report_data(HISTORY, MANIFESTS, lambda r, p: None, runs, 0.8)
    data.update(current="v4", damaged=[])
    dated = report.report_model(data, "gpu-ct-1", 0.8, verify, verify_time=1796400000)
    assert dated["verify"]["written"] == "2026-12-04T16:00:00+00:00"
    assert "(release v4, judged 2026-12-04T16:00:00+00:00)" in report.report_html(dated)


def test_a_job_page_shows_every_host_and_links_their_pages():
    models = {host: model_of(HISTORY) | {"host": host} for host in ("gpu-ct-1", "gpu-ct-2")}
    models["gpu-ct-3"] = report.report_model(None, "gpu-ct-3")
    jobs = report.report_jobs(models, {"gpu-ct-1": "llama8b", "gpu-ct-2": "llama8b",
                                       "gpu-ct-3": "llama8b", "solo": ""})  # fmt: skip
    page = report.job_report_html(jobs["llama8b"], "llama8b")
    hosts = re.findall(r"<tr class='host' data-host='([^']+)'><td><a href='([^']+)'>", page)
    assert hosts == [("gpu-ct-1", "report-gpu-ct-1.html"), ("gpu-ct-2", "report-gpu-ct-2.html"),
                     ("gpu-ct-3", "report-gpu-ct-3.html")]  # fmt: skip
    assert points(page, "dflash-points-gpu-ct-1-deploy") == 3
    assert points(page, "dflash-points-gpu-ct-2-unrated") == 1


def test_a_runs_series_comes_from_its_train_log_without_the_compile_step():
    log = [
        "2026-12-04T10:00:00.000+00:00 no checkpoint in /x: starting at step 0",
        "2026-12-04T10:00:30.000+00:00 step 1 loss 9.1 tokens/s 40 lr 1e-4 step_s 30.0 | ...",
        *(f"2026-12-04T10:01:{n:02d}.000+00:00 step {n} loss 5.0 tokens/s {1000 + n} lr 1e-4"
          for n in range(2, 50)),
        "2026-12-04T10:02:00.000+00:00 checkpoint /x/step_49",
    ]  # fmt: skip
    series = step_series(log)
    assert series[0] == {"time": "2026-12-04T10:01:02.000+00:00", "step": 2,
                         "tokens_per_s": 1002.0}  # fmt: skip
    assert len(series) == 48
    sample = step_series(log, points=10)
    assert len(sample) <= 10 and sample[-1]["step"] == 49


def test_a_verdict_older_than_a_deployment_is_marked_stale_and_restarts_are_no_cause():
    """Issue 47: the page showed a verify verdict from before two later deploys as current,
    and blamed a drop on `restarts: 1 -> 6` that came after its health check."""
    verify = {"hosts": {"gpu-ct-1": {"verdict": "ok", "release": "v2", "findings": []}}}
    data = report_data(HISTORY, MANIFESTS, lambda r, p: None, {}, 0.8)
    data.update(current="v4", damaged=[])
    # Judged at 11:30: v3 (12:00, rolled back) and v4 (13:00) came after it.
    old = report.report_model(data, "gpu-ct-1", 0.8, verify, verify_time=1796383800)
    page = report.report_html(old)
    assert "<b>Stale</b>: 2 deployments since this verdict (#3 v3, #4 v4)" in page
    fresh = report.report_model(data, "gpu-ct-1", 0.8, verify, verify_time=1796400000)
    assert "Stale" not in report.report_html(fresh)
    # The slower run's restarts (after its health check) are not among the drop's causes.
    history = [dict(HISTORY[0]), dict(HISTORY[1], run_id="run-v2")]
    history.append(
        {
            "time": "2026-12-04T11:30:00+00:00",
            "action": "restart",
            "run_id": "run-v2",
            "reason": "signal SIGKILL",
            "result": "restarted",
        }
    )
    data = report_data(history, MANIFESTS, lambda r, p: None, {}, 0.8)
    data.update(current="v2", damaged=[])
    [drop] = report.report_model(data, "gpu-ct-1", 0.8)["drops"]
    assert drop["previous"]["restarts"]["to"], "the restart is in the data"
    assert "restarts:" not in report.report_html(report.report_model(data, "gpu-ct-1", 0.8))


def test_point_labels_close_in_time_and_speed_do_not_overlap():
    """Issue 47: deployments minutes apart at like speeds printed their labels over each
    other. Each label moves up or down until it overlaps none before it."""
    from matplotlib.figure import Figure

    history = [dict(line(f"v{n}", 10000 + 50 * n, hour=10), time=f"2026-12-04T10:0{n}:00+00:00")
               for n in range(5)]  # fmt: skip
    history.append(line("v5", 9000, hour=23))  # the axis spans the day: the five cluster
    data = report_data(history, {}, lambda r, p: None, {}, 0.8)
    data.update(current="v5", damaged=[])
    model = report.report_model(data, "gpu-ct-1", 0.8)

    def overlaps(spread: bool) -> int:
        figure = Figure(figsize=(11, 4.2), layout="constrained")
        ax = figure.add_subplot()
        report._plot_host(ax, model, None, None)
        ax.xaxis_date()
        ax.set_ylim(bottom=0)
        if spread:
            report.spread_labels(figure, ax)
        boxes = report.label_boxes(figure, ax)
        assert len(boxes) == 6
        return sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])

    assert overlaps(spread=False) > 0, "the case does not make labels overlap"
    assert overlaps(spread=True) == 0
    assert "#6 v5" in report.report_html(model)  # the page still draws
