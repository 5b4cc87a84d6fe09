"""The filter plugins under the names the unit tests import them by: filter_plugins/ is no
package (Ansible loads each file by its path). The shared code needs nothing here: it is the
collection dflash.deploy's module_utils, imported by its one name from the repository root."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import REPO


def _load(name: str, path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_load("dflash_filters", REPO / "filter_plugins" / "dflash_verify_findings.py")
_load("dflash_input_filters", REPO / "filter_plugins" / "dflash_inputs.py")
_load("dflash_history_filters", REPO / "filter_plugins" / "dflash_history.py")
_load("dflash_verify_filters", REPO / "filter_plugins" / "dflash_verify_throughput.py")
_load("dflash_verify_gpu_filters", REPO / "filter_plugins" / "dflash_verify_gpu.py")
_load("dflash_job_filters", REPO / "filter_plugins" / "dflash_job.py")
_load("dflash_job_verify_filters", REPO / "filter_plugins" / "dflash_job_verify.py")
_load("dflash_plan_filters", REPO / "filter_plugins" / "dflash_plan.py")
