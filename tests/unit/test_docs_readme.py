"""The commands of README.md and docs/*.md name what exists: every `make` target is in the
Makefile, every playbook and repository path is in the checkout, every `-e` variable is one the
roles or playbooks read; and the README's Quick start puts the venv first on PATH before its
first bare `ansible-playbook`. tests/integration/test_readme_quickstart.py runs a subset."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Written by the toolkit, not in a checkout (.gitignore): the demo's target, builds, reports.
GENERATED = ("sandbox", ".build", "reports", "exports", ".venv")


def sh_blocks(text: str) -> list[str]:
    return [m[2] for m in re.finditer(r"(?ms)^( *)```sh\n(.*?)^\1```", text)]


def commands(block: str) -> list[list[str]]:
    """Each command line of a shell block as words, comments and continuations resolved."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        words: list[str] = []
        for word in [*shlex.split(line, comments=True), "&&"]:
            if word in ("&&", ";") or word.endswith(";"):
                words += [word.rstrip(";")] if word not in ("&&", ";") else []
                if words:
                    found.append(words)
                words = []
            else:
                words.append(word)
    return found


def quick_start() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*):(?!=)", text, re.MULTILINE))


def known_variables() -> set[str]:
    names = set()
    for path in REPO.glob("roles/*/meta/argument_specs.yml"):
        for spec in yaml.safe_load(path.read_text())["argument_specs"].values():
            names.update(spec.get("options") or {})
    playbooks = "\n".join(p.read_text() for p in REPO.glob("playbooks/*.yml"))
    names.update(re.findall(r"\b(dflash_\w+) \| default\(", playbooks))
    return names


def exists_in_checkout(path: str) -> bool:
    if (REPO / path).exists() or path.split("/")[0] in GENERATED:
        return True
    # A copy of an example inventory (inventory/proxmox.yml from inventory/proxmox.example.yml).
    stem = Path(path)
    return (REPO / stem.with_name(f"{stem.stem}.example{stem.suffix}")).exists()


def problems_of(words: list[str]) -> list[str]:
    problems = []
    tool = words[0].removeprefix(".venv/bin/")
    if tool == "make":
        problems += [f"no make target {t}" for t in words[1:] if t not in make_targets()]
    if tool == "ansible-playbook":
        books = [w for w in words[1:] if w.endswith(".yml") and not w.startswith("inventory/")]
        problems += [f"no playbook {b}" for b in books if not (REPO / b).is_file()]
        if len(books) != 1:
            problems.append(f"{shlex.join(words)}: names {len(books)} playbooks")
        for flag, value in itertools.pairwise(words):
            if flag == "-e" and "=" in value:
                name = value.split("=", 1)[0]
                if name not in known_variables():
                    problems.append(f"-e {name}: no role or playbook reads it")
            if flag == "-i" and not exists_in_checkout(value):
                problems.append(f"no inventory {value}")
    venv_tools = ("ansible-playbook", "pytest", "python", "antsibull-changelog")
    if words[0].startswith(".venv/bin/") and tool not in venv_tools:
        problems.append(f"{words[0]}: not a tool the venv is documented to have")
    for word in words[1:]:
        path = re.fullmatch(r"[\w.-]+(?:/[\w.-]+)+/?", word) and not word.startswith(("/", "-"))
        if path and not exists_in_checkout(word.rstrip("/")):
            problems.append(f"no {word} in the checkout")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_commands_name_what_exists(page: Path):
    found = [
        f"{shlex.join(words)}: {problem}"
        for block in sh_blocks(page.read_text())
        for words in commands(block)
        for problem in problems_of(words)
    ]
    assert found == [], found


def test_the_quick_start_has_its_commands():
    lines = [shlex.join(w) for block in sh_blocks(quick_start()) for w in commands(block)]
    for expected in ("make venv", ". .venv/bin/activate", "make demo", "make test",
                     "ansible-playbook playbooks/stop.yml"):  # fmt: skip
        assert expected in lines, (expected, lines)


def test_the_quick_start_puts_the_venv_on_path_before_its_first_bare_ansible_command():
    """The new user's `ansible-playbook: command not found`: a bare command needs .venv/bin on
    PATH, set after `make venv` made it and before the first bare use."""
    lines = [w for block in sh_blocks(quick_start()) for w in commands(block)]
    order = [shlex.join(w) for w in lines]
    activate = order.index(". .venv/bin/activate")
    assert order.index("make venv") < activate
    bare = [i for i, w in enumerate(lines) if w[0] in ("ansible-playbook", "pytest", "ansible")]
    assert bare and min(bare) > activate


def test_the_readme_says_how_to_put_the_venv_first_on_path_once():
    text = (REPO / "README.md").read_text()
    assert ". .venv/bin/activate" in text
    # No other way of activating it is offered (the old README mixed `source` and full paths).
    assert "source .venv/bin/activate" not in text


def test_the_readme_promises_no_duration():
    """`make venv` took 159 s for a new user where a banner said about a minute: the README
    states no time for a step."""
    text = (REPO / "README.md").read_text()
    assert not re.search(r"\b(about|under|within) (a|one|\d+) (second|minute|hour)s?\b", text)


def test_the_checker_sees_a_wrong_command():
    assert problems_of(["make", "nosuchtarget"]) == ["no make target nosuchtarget"]
    assert problems_of(["ansible-playbook", "nosuch.yml"]) == ["no playbook nosuch.yml"]
    assert problems_of(["ansible-playbook", "deploy.yml", "-e", "dflash_refs=v1"]) == [
        "-e dflash_refs: no role or playbook reads it"
    ]
    assert problems_of(["ansible-playbook", "-i", "inventory/proxmox.yml", "verify.yml"]) == []
    assert commands("a && b # c; d\nd \\\n  e; f\n") == [["a"], ["b"], ["d", "e"], ["f"]]
