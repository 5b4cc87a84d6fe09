"""Makes the toolkit's module_utils importable the way Ansible exposes them to modules
(`ansible.module_utils.<name>`), so the same code can be unit-tested directly."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import REPO


def _load(name: str, path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


for _name in (
    "dflash_release",
    "dflash_state",
    "dflash_lock",
    "dflash_history",
    "dflash_procs",
    "dflash_gpu",
):
    _load(f"ansible.module_utils.{_name}", REPO / "module_utils" / f"{_name}.py")
_load("dflash_filters", REPO / "filter_plugins" / "dflash.py")
_load("dflash_history_filters", REPO / "filter_plugins" / "dflash_history.py")
_load("dflash_verify_filters", REPO / "filter_plugins" / "dflash_verify.py")
_load("dflash_verify_gpu_filters", REPO / "filter_plugins" / "dflash_verify_gpu.py")
