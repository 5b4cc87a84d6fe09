# Writes verify.yml's JSON and JUnit reports on the controller, inside the controller's own
# process: no module run, so the reports cost milliseconds instead of a module round trip each.
from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ElementTree
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
---
module: dflash_verify_report
short_description: Write verify.yml's JSON and JUnit reports on the controller
description:
  - Runs on the controller only (an action plugin, no module is sent anywhere). Creates the
    reports' folders and writes both files atomically (a temp file, then a rename). The reports
    are outputs of the audit, not changes to a target, so it always reports C(changed=false) and
    writes in check mode too.
options:
  report:
    description: host -> C(verdict) (ok, drift, unreachable), C(release), C(findings).
    type: dict
    required: true
  json_path:
    description: Where the JSON report goes (C({"hosts": report})).
    type: path
    required: true
  junit_path:
    description: Where the JUnit report goes (one test case per host).
    type: path
    required: true
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Write the reports
  dflash_verify_report:
    report: "{{ dflash_verify_report }}"
    json_path: reports/verify.json
    junit_path: reports/verify.junit.xml
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
"""


def _what(item: dict) -> str:
    for key in ("path", "package", "pid"):
        if item.get(key) not in (None, ""):
            return str(item[key])
    return ""


def junit_xml(report: dict[str, dict]) -> bytes:
    """One <testcase> per host: a <failure> listing the findings of a drifted host, an <error>
    for one that could not be read."""
    verdicts = [result.get("verdict") for result in report.values()]
    suite = ElementTree.Element(
        "testsuite",
        name="dflash-verify",
        tests=str(len(report)),
        failures=str(verdicts.count("drift")),
        errors=str(verdicts.count("unreachable")),
    )
    for host, result in sorted(report.items()):
        case = ElementTree.SubElement(suite, "testcase", classname="dflash.verify", name=host)
        if result.get("verdict") == "unreachable":
            ElementTree.SubElement(
                case, "error", message=f"{host} could not be read (unreachable or failed)"
            )
        elif result.get("verdict") == "drift":
            findings = result.get("findings") or []
            kinds = list(dict.fromkeys(str(item.get("kind")) for item in findings))
            failure = ElementTree.SubElement(
                case, "failure", message=f"{len(findings)} finding(s): {', '.join(kinds)}"
            )
            failure.text = "\n" + "".join(
                f"{item.get('kind')} {_what(item)}: expected {item.get('expected')}, "
                f"found {item.get('found')}; fix: {item.get('hint')}\n"
                for item in findings
            )
    ElementTree.indent(suite)
    return ElementTree.tostring(suite, encoding="UTF-8", xml_declaration=True) + b"\n"


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
    _VALID_ARGS = frozenset(("report", "json_path", "junit_path"))
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(
            argument_spec={
                "report": {"type": "dict", "required": True},
                "json_path": {"type": "path", "required": True},
                "junit_path": {"type": "path", "required": True},
            }
        )
        report = args["report"]
        try:
            write_atomically(
                args["json_path"],
                (json.dumps({"hosts": report}, indent=4, sort_keys=True) + "\n").encode(),
            )
            write_atomically(args["junit_path"], junit_xml(report))
        except OSError as err:
            raise AnsibleActionFail(f"cannot write the verify reports: {err}") from err
        result.update(changed=False, json_path=args["json_path"], junit_path=args["junit_path"])
        return result
