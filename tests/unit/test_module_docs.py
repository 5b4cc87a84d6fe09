"""Every module's DOCUMENTATION, with the doc fragments it extends (doc_fragments/) merged in,
says what its argument_spec does (names, types, defaults, choices, required, list elements,
no_log), parses as YAML, and `ansible-doc` renders it: the check ansible-test's
validate-modules makes, for a repository that is no collection (`make lint` runs this file)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from ansible.plugins.loader import PluginLoader
from ansible.utils.plugin_docs import get_docstring

from tests.helpers import REPO

MODULES = sorted((REPO / "library").glob("*.py"))
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
# The doc fragment loader ansible-doc builds from ansible.cfg's doc_fragment_plugins, here
# pointed at the folder itself so the tests read the same fragments from any working directory.
FRAGMENTS = PluginLoader(
    "ModuleDocFragment",
    "ansible.plugins.doc_fragments",
    str(REPO / "doc_fragments"),
    "doc_fragments",
)


class _Captured(Exception):
    pass


def argument_spec(path: Path) -> dict:
    """The spec main() hands to AnsibleModule, by running main() with a stand-in that stops
    there (the module's own code, not a copy of its spec)."""
    spec = importlib.util.spec_from_file_location(f"module_under_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen: dict = {}

    def capture(*args, **kwargs):
        seen.update(kwargs)
        raise _Captured

    with mock.patch.object(module, "AnsibleModule", side_effect=capture), pytest.raises(_Captured):
        module.main()
    return seen["argument_spec"]


def documentation(path: Path) -> dict:
    """DOCUMENTATION as ansible-doc shows it: read and merged by Ansible's own code, so a
    fragment's options come in and the module's own options of the same name replace them."""
    doc = get_docstring(str(path), FRAGMENTS, is_module=True)[0]
    assert doc, f"{path.name} has no DOCUMENTATION"
    return doc


def expected(option: dict) -> dict:
    """An option as the spec should say it, with the spec's own defaults made explicit."""
    return {
        "type": option.get("type", "str"),
        "required": bool(option.get("required", False)),
        "default": option.get("default"),
        "choices": option.get("choices"),
        "elements": option.get("elements"),
    }


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_documentation_matches_the_argument_spec(path: Path):
    docs = documentation(path)
    assert docs["module"] == path.stem
    assert "check_mode" in (docs.get("attributes") or {}), f"{path.stem}: no attributes block"
    options = docs.get("options") or {}
    spec = argument_spec(path)
    assert sorted(options) == sorted(spec), f"{path.stem}: documented vs spec options differ"
    for name, option in options.items():
        assert option.get("description"), f"{path.stem}.{name} has no description"
        assert expected(option) == expected(spec[name]), f"{path.stem}.{name}"


def ansible_doc(*modules: str) -> tuple[dict[str, str], str, int]:
    """The pages `ansible-doc` renders for `modules` in one run, by name; its stderr and exit."""
    proc = subprocess.run(
        [str(ANSIBLE_DOC), "-M", str(REPO / "library"), *modules],
        capture_output=True, text=True, check=False, cwd=REPO,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    # Each module's page starts with `> MODULE <name> (<path>)`.
    pages = re.split(r"^> MODULE (\S+) \(.*\)$", proc.stdout, flags=re.MULTILINE)[1:]
    return dict(zip(pages[::2], pages[1::2], strict=True)), proc.stderr, proc.returncode


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[str, str, int]]:
    """Each module's page, ansible-doc's stderr and exit status. One run renders them all (one
    start instead of twenty); a module it fails on stops the whole run, so then each is
    rendered on its own and only the broken one fails."""
    pages, stderr, code = ansible_doc(*(path.stem for path in MODULES))
    if code == 0:
        return {path.stem: (pages.get(path.stem, ""), stderr, code) for path in MODULES}
    alone = {path.stem: ansible_doc(path.stem) for path in MODULES}
    return {name: (own.get(name, ""), err, rc) for name, (own, err, rc) in alone.items()}


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_ansible_doc_renders_it(path: Path, rendered: dict[str, tuple[str, str, int]]):
    page, stderr, code = rendered[path.stem]
    assert code == 0 and "OPTIONS" in page, stderr


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_check_and_diff_mode_are_said_once_and_each_module_states_its_support(path):
    """What the modes mean comes from doc_fragments/dflash_attributes.py (merged in); the
    module says only its support and, with `details` (Ansible's key), what it does then."""
    attributes = documentation(path)["attributes"]
    for mode in ("check_mode", "diff_mode"):
        assert attributes[mode]["support"] in ("full", "partial", "none"), (path.name, mode)
        assert attributes[mode]["description"].startswith(
            {"check_mode": "Can run in check mode", "diff_mode": "Returns what changed"}[mode]
        ), f"{path.name} describes {mode} itself: say `details`, the fragment says the rest"
