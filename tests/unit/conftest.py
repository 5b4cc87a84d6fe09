"""Makes the toolkit's module_utils importable the way Ansible exposes them to modules
(`ansible.module_utils.<name>`), so the same code can be unit-tested directly."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from tests.helpers import REPO

MODULE_UTILS = REPO / "module_utils"


class ModuleUtilsFinder(importlib.abc.MetaPathFinder):
    """`ansible.module_utils.dflash_*` from module_utils/, loaded when first imported (in
    whatever order the modules import each other), as AnsiballZ would ship them."""

    PREFIX = "ansible.module_utils."

    def find_spec(self, fullname, path=None, target=None):
        name = fullname.removeprefix(self.PREFIX)
        if fullname.startswith(self.PREFIX) and (MODULE_UTILS / f"{name}.py").is_file():
            return importlib.util.spec_from_file_location(fullname, MODULE_UTILS / f"{name}.py")
        return None


sys.meta_path.insert(0, ModuleUtilsFinder())


def _load(name: str, path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_load("dflash_filters", REPO / "filter_plugins" / "dflash.py")
_load("dflash_input_filters", REPO / "filter_plugins" / "dflash_inputs.py")
_load("dflash_history_filters", REPO / "filter_plugins" / "dflash_history.py")
_load("dflash_verify_filters", REPO / "filter_plugins" / "dflash_verify.py")
_load("dflash_verify_gpu_filters", REPO / "filter_plugins" / "dflash_verify_gpu.py")
_load("dflash_job_filters", REPO / "filter_plugins" / "dflash_job.py")
_load("dflash_job_verify_filters", REPO / "filter_plugins" / "dflash_job_verify.py")
_load("dflash_plan_filters", REPO / "filter_plugins" / "dflash_plan.py")
