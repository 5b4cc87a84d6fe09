"""history.yml's report of a real local run: three deployments of the real trainer, the second
slower (a code change and a sleep per step), the third fast again; the page names the drop and
what changed, draws a point per deployment and each run's steps, and reads as a person would
read it in Chromium (no console errors, the change list visible). Its screenshot is kept
(DFLASH_TEST_ARTIFACTS, else the test's folder): docs/report.png is one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.conftest import TRAINER_ARGS, add_release
from tests.report_browser import Browser, require_browser

pytestmark = pytest.mark.slow

ARGS = {**TRAINER_ARGS, "log_every": 2}


def test_a_local_run_with_a_drop_reads_in_a_browser(deploy, trainer_repo, playbook, tmp_path):
    require_browser()
    out = tmp_path / "reports"
    runs = [deploy("v1", dflash_trainer_args=ARGS)]
    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2: a slower release\n")
    # 8 s a step instead of v1's 1 s (IDLE_STEP_S): at most 16 tokens/s (128 a step), under
    # half of v1's unless v1's own steps took over 6 s (a step of TRAINER_ARGS takes ~0.06 s),
    # so a drop whatever the band.
    runs.append(deploy("v2", dflash_trainer_args={**ARGS, "sleep_per_step": 8.0}))
    add_release(trainer_repo, "v3", "dflash/__init__.py", "# v3: fast again\n")
    runs.append(deploy("v3", dflash_trainer_args=ARGS))
    assert all(run.rc == 0 for run in runs), [run.output for run in runs]
    verify = playbook("verify.yml")
    assert verify.report is not None, verify.output

    listed = playbook(
        "history.yml", dflash_history_html=True, dflash_history_html_dir=str(out),
        dflash_verify_min_throughput_ratio=0.8,
    )  # fmt: skip
    assert listed.rc == 0 and listed.changed() == 0, listed.output
    model = json.loads((out / "report.json").read_text())["hosts"]["local"]
    assert [(d["number"], d["reference"]) for d in model["drops"]] == [(2, 1)]
    side = model["drops"][0]["previous"]
    assert "dflash/__init__.py" in side["files"]["changed"]
    changes = {(c["section"], c["name"]): c["to"] for c in side["changes"]}
    assert changes[("run_sh", "trainer_args.sleep_per_step")] == 8.0
    assert all(row["series"] for row in model["deployments"][:2]), "each run's steps"
    assert model["verify"]["verdict"] in ("ok", "drift")

    page = out / "report-local.html"
    with Browser(1280, 1500) as browser:
        browser.open(page)
        assert [e for e in browser.console() if e["level"] == "SEVERE"] == []
        drawn = browser.run(
            "return document.querySelectorAll('[id^=\"dflash-points\"] use').length"
        )
        assert drawn == 3 == len(model["deployments"])
        changes_shown = browser.run(
            "const list = document.querySelector('#drop-2 ul.changes');"
            "const box = list.getBoundingClientRect();"
            "return box.height > 0 && getComputedStyle(list).visibility === 'visible'"
            " ? list.innerText : null"
        )
        assert changes_shown and "dflash/__init__.py" in changes_shown
        assert "sleep_per_step" in changes_shown
        artifacts = Path(os.environ.get("DFLASH_TEST_ARTIFACTS") or tmp_path)
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(artifacts / "report-local.png")
    assert shot.stat().st_size > 10_000
