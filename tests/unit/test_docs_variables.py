"""docs/variables.md against the roles: every variable an argument spec declares is on the
page, every variable the page lists is declared by a spec (or, in its own section, read by a
playbook outside any spec), and a plain default the page states is the role default."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "variables.md"
OUTSIDE = "Variables outside the argument specs"
NAME = r"(?:dflash|proxmox)_\w+"


def spec_variables() -> dict[str, set[str]]:
    """{variable: {role, ...}} over every entry point of every role's argument spec."""
    found: dict[str, set[str]] = {}
    for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        specs = yaml.safe_load(path.read_text())["argument_specs"]
        for spec in specs.values():
            for name in spec.get("options") or {}:
                found.setdefault(name, set()).add(path.parts[-3])
    return found


def role_defaults() -> dict[str, object]:
    values: dict[str, object] = {}
    for path in sorted(REPO.glob("roles/*/defaults/main.yml")):
        values.update(yaml.safe_load(path.read_text()) or {})
    return values


def page_sections() -> dict[str, list[list[str]]]:
    """{section heading: table rows (cells)} of docs/variables.md, header rows left out."""
    sections: dict[str, list[list[str]]] = {}
    heading = ""
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("| ") and not line.startswith("| ---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            if cells[0] != "variable":
                sections.setdefault(heading, []).append(cells)
    return sections


def names_in(cell: str) -> list[str]:
    return re.findall(rf"`({NAME})`", cell)


def listed(exclude_outside: bool = True) -> set[str]:
    names = set()
    for heading, rows in page_sections().items():
        if exclude_outside and heading == OUTSIDE:
            continue
        for row in rows:
            names.update(names_in(row[0]))
    return names


def test_every_spec_variable_is_on_the_page():
    missing = sorted(set(spec_variables()) - listed())
    assert missing == [], f"docs/variables.md lacks variables the argument specs declare: {missing}"


def test_every_variable_on_the_page_is_declared_by_a_spec():
    extra = sorted(listed() - set(spec_variables()))
    assert extra == [], f"docs/variables.md lists variables no argument spec declares: {extra}"


def test_every_role_default_is_on_the_page():
    missing = sorted(set(role_defaults()) - listed())
    assert missing == [], f"docs/variables.md lacks variables with a role default: {missing}"


def test_the_variables_outside_the_specs_are_read_by_playbooks_and_in_no_spec():
    rows = page_sections().get(OUTSIDE)
    assert rows, f"docs/variables.md has no '## {OUTSIDE}' table"
    playbooks = "\n".join(path.read_text() for path in sorted(REPO.glob("playbooks/*.yml")))
    for row in rows:
        for name in names_in(row[0]):
            assert name not in spec_variables(), f"{name} is in a spec: list it in its table"
            assert re.search(rf"\b{name}\b", playbooks), f"no playbook reads {name}"


def test_the_user_variables_are_the_dflash_and_dflash_proxmox_roles():
    """The user tables hold what a user sets; the step roles' inputs have a table of their own."""
    specs = spec_variables()
    users = {
        name
        for heading, rows in page_sections().items()
        if heading in ("User variables", "The Proxmox container and its API")
        for row in rows
        for name in names_in(row[0])
    }
    user_roles = {"dflash", "dflash_proxmox"}
    assert sorted(n for n in users if not specs.get(n, set()) & user_roles) == []
    declared = {n for n, roles in specs.items() if roles & user_roles}
    assert sorted(declared - users) == []


def test_plain_defaults_on_the_page_are_the_role_defaults():
    """Where the page states a default as plain values (one per variable named), each is the
    role default; templated defaults (`{{ ... }}`) and prose are left to the reader."""
    defaults = role_defaults()
    checked = 0
    for heading, rows in page_sections().items():
        if heading == OUTSIDE:
            continue
        for row in rows:
            names = names_in(row[0])
            cell = row[1] if heading != "Step roles' inputs" else row[3]
            values = re.findall(r"`([^`]*)`", cell)
            if len(names) == 1 and values:
                pairs = [(names[0], values[0])]
            elif len(values) == len(names):
                pairs = list(zip(names, values, strict=True))
            else:
                continue
            for name, text in pairs:
                if name not in defaults or "{{" in str(defaults[name]) or "{{" in text:
                    continue
                stated = yaml.safe_load(text)
                assert stated == defaults[name], (
                    f"docs/variables.md says {name} defaults to {text}, "
                    f"the role default is {defaults[name]!r}"
                )
                checked += 1
    assert checked >= 30, checked
