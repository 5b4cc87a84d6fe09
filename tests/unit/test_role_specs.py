"""The roles' argument specs are the contract of their inputs: the `dflash` role's spec covers
every variable of its defaults (same default), every input has a real type and a description,
a step role types a user variable as the `dflash` role does, the README's variable table names
what the specs declare, and `ansible-doc` renders every role."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

ROLES = REPO / "roles"
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
# A list of indexes or a string of ranges ('0-4'): no Ansible type takes both as they are.
RAW_ALLOWED = {"dflash_target_gpus", "dflash_drafter_gpus"}


def spec_of(role: str, entry: str = "main") -> dict:
    data = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    return data["argument_specs"][entry]["options"]


def all_specs() -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        for entry, spec in yaml.safe_load(path.read_text())["argument_specs"].items():
            out.append((path.parent.parent.name, entry, spec.get("options") or {}))
    return out


def walk(options: dict, prefix: str = ""):
    for name, option in options.items():
        yield prefix + name, option
        yield from walk(option.get("options") or {}, f"{prefix}{name}.")


def test_the_dflash_spec_covers_every_default_with_its_value():
    defaults = yaml.safe_load((ROLES / "dflash" / "defaults" / "main.yml").read_text())
    spec = spec_of("dflash")
    assert sorted(set(defaults) - set(spec)) == []
    for name, value in defaults.items():
        assert spec[name].get("default") == value, name


@pytest.mark.parametrize(("role", "entry", "options"), all_specs(), ids=lambda x: str(x)[:40])
def test_every_input_is_typed_and_described(role, entry, options):
    for name, option in walk(options):
        assert option.get("description"), f"{role}/{entry}: {name} has no description"
        kind = option.get("type")
        assert kind and (kind != "raw" or name in RAW_ALLOWED), f"{role}/{entry}: {name} {kind}"
        if kind == "list":
            assert option.get("elements"), f"{role}/{entry}: list {name} without elements"


def test_step_roles_type_user_variables_as_the_dflash_role_does():
    user = spec_of("dflash")
    for role, entry, options in all_specs():
        for name, option in options.items():
            if role != "dflash" and name in user:
                assert option["type"] == user[name]["type"], (role, entry, name)
                if "elements" in user[name]:
                    assert option.get("elements") == user[name]["elements"], (role, name)


def readme_variables() -> set[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("### Variables", 1)[1].split("\n### ", 1)[0]
    names = set()
    for row in re.findall(r"^\| (.+?) \|", section, re.MULTILINE):
        names.update(re.findall(r"`((?:dflash|proxmox)_\w+)`", row))
    return names


def test_the_readme_table_lists_the_specs_variables():
    declared = set(spec_of("dflash")) | set(spec_of("dflash_proxmox"))
    table = readme_variables()
    assert sorted(table - declared) == [], "README names variables no spec declares"
    assert sorted(set(spec_of("dflash")) - table) == [], "README's table lacks variables"


def test_playbooks_validate_once_per_play():
    """A play lists the `dflash` role first, which checks every user variable; the step roles
    it imports skip their own check of the same values (rolespec_validate: false)."""
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        text = path.read_text()
        for play in yaml.safe_load(text):
            if "hosts" not in play:
                continue
            roles = [r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])]
            if not roles and "import_role" not in text:
                continue  # a play of no dflash role (wheelhouse.yml)
            assert roles[:1] == ["dflash"], f"{path.name}: the dflash role is not listed first"
        imports = re.findall(r"ansible\.builtin\.import_role:\n((?:\s{8,}.*\n)+)", text)
        for args in imports:
            assert "rolespec_validate: false" in args, f"{path.name}: {args}"


SPEC_ROLES = sorted(p.parent.parent.name for p in ROLES.glob("*/meta/argument_specs.yml"))


@pytest.mark.parametrize("role", SPEC_ROLES)
def test_ansible_doc_renders_every_role(role):
    done = subprocess.run(
        [str(ANSIBLE_DOC), "-t", "role", "-r", str(ROLES), role],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr
    for _, entry, options in [s for s in all_specs() if s[0] == role]:
        for name in options:
            assert name in done.stdout, (role, entry, name)
