"""A report page as Chromium shows it, without deploying (the page of a real local run is
test_local_report.py's): it loads without console errors, its figure holds one point per
deployment the page's data records, the drop's change list is visible and its file opens its
diff, and a screenshot is kept (DFLASH_TEST_ARTIFACTS, else the test's folder)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.report_browser import Browser, require_browser
from tests.unit.test_report import HISTORY, model_of, report


def test_a_report_page_reads_in_a_browser(tmp_path):
    require_browser()
    page = tmp_path / "report-gpu-ct-1.html"
    page.write_text(report.report_html(model_of(HISTORY)))
    with Browser(1280, 1400) as browser:
        browser.open(page)
        errors = [e for e in browser.console() if e["level"] in ("SEVERE", "WARNING")]
        assert errors == []
        drawn, recorded = browser.run(
            "const data = JSON.parse(document.getElementById('dflash-report-data').textContent);"
            "return [document.querySelectorAll('[id^=\"dflash-points\"] use').length,"
            " data.deployments.filter(d => ['deploy', 'rollback'].includes(d.action)).length]"
        )
        assert drawn == recorded == 4
        shown = browser.run(
            "const list = document.querySelector('#drop-2 ul.changes');"
            "const box = list.getBoundingClientRect();"
            "return box.width > 0 && box.height > 0"
            " && getComputedStyle(list).visibility === 'visible' ? list.innerText : null"
        )
        assert shown and "dflash/model.py" in shown
        assert "torch 2.11.0+cu128 -> 2.11.0+cu130" in shown
        # The changed file links to its diff, which opens where the link leads.
        opened = browser.run(
            "document.querySelector('#drop-2 ul.changes a').click();"
            "const text = document.getElementById('drop-2-previous-dflash-model-py');"
            "return text.closest('details').open ? text.innerText : null"
        )
        assert opened and "+LAYERS = 6" in opened
        artifacts = Path(os.environ.get("DFLASH_TEST_ARTIFACTS") or tmp_path)
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(artifacts / "report-browser.png")
    assert shot.read_bytes().startswith(b"\x89PNG")
