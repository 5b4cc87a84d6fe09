"""README's ansible-runner example, run as it is written (against an empty local target): the
verify report is the machine-readable result and the exit status is verify's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, playbook_env


def readme_example() -> str:
    section = (REPO / "docs" / "ansible-runner.md").read_text()
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]


def test_the_readme_runner_example_runs(tmp_path: Path):
    code = readme_example()
    # The same code, pointed at an empty state root and a report of this test.
    report = tmp_path / "verify.json"
    extravars = '{"dflash_verify_json": report_path}'
    assert (
        extravars in code
        and 'report_path = os.path.join(checkout, "reports", "verify.json")' in code
    )
    code = code.replace(
        'report_path = os.path.join(checkout, "reports", "verify.json")',
        f"report_path = {str(report)!r}",
    ).replace(
        extravars,
        f'{{"dflash_verify_json": report_path, "dflash_root": {str(tmp_path / "dflash")!r}}}',
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=playbook_env(), capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    # An empty target is drift (no release): exit status 2, and the report says why.
    assert done.returncode == 2, done.stdout + done.stderr
    verdict = json.loads(report.read_text())["hosts"]["local"]
    assert verdict["verdict"] == "drift" and "release" in [f["kind"] for f in verdict["findings"]]
    assert done.stdout.startswith("local drift ["), done.stdout
