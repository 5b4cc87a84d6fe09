"""The roles' argument specs are the contract of their inputs: the `dflash` role's spec covers
every variable of its defaults (same default), every input has a real type and a description,
a step role declares the inputs of its own and no user variable (the `dflash` role's spec
declares those once), the README's variable table names what the specs declare, every play
gives each dflash module its state root (and, holding the deploy lock, its token) through
module_defaults, and `ansible-doc` renders every role."""

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
# A list of indexes or a string of ranges ('0-4'), and `auto` or a number of seconds: no
# Ansible type takes both as they are (module_utils/dflash_run_spec.py checks them).
RAW_ALLOWED = {"dflash_target_gpus", "dflash_drafter_gpus", "dflash_hang_after"}


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


LIBRARY = REPO / "library"
MODULES = {p.stem for p in LIBRARY.glob("*.py")}


def walk_tasks(tasks):
    """Every task of a task list, blocks opened (block, rescue, always)."""
    for task in tasks or []:
        yield task
        for part in ("block", "rescue", "always"):
            yield from walk_tasks(task.get(part))


def role_files(role: str, *folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROLES / role / f).glob("*")) if p.is_file()]


def names_read(role: str) -> set[str]:
    """The dflash_<role>_* variables the role's tasks and templates name; filters
    (`| dflash_job_out`, `dflash_job_plan(...)`), modules and comment lines left out."""
    found = set()
    for path in role_files(role, "tasks", "templates"):
        lines = path.read_text().splitlines()
        text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
        for m in re.finditer(rf"(\|\s*)?\b({role}_\w+)\b(\s*\()?", text):
            if not (m.group(1) or m.group(3)):
                found.add(m.group(2))
    return found - MODULES


def names_set(role: str) -> set[str]:
    """What the role sets itself: register, set_fact, vars: of its tasks, vars/main.yml."""
    found = set()
    for path in role_files(role, "tasks"):
        for task in walk_tasks(yaml.safe_load(path.read_text())):
            found.update([task["register"]] if "register" in task else [])
            found.update(task.get("vars") or {})
            found.update(task.get("ansible.builtin.set_fact") or {})
    for path in role_files(role, "vars"):
        found.update(yaml.safe_load(path.read_text()) or {})
    return found


STEP_ROLES = sorted({role for role, _, _ in all_specs()} - {"dflash"})


@pytest.mark.parametrize("role", STEP_ROLES)
def test_a_step_role_declares_its_own_inputs_and_no_user_variable(role):
    """The dflash role's spec declares every user variable once (dflash_proxmox's the proxmox_*
    ones); a step role's spec declares what the playbooks hand it (its dflash_<role>_* inputs)
    and points to the user variables' spec, each entry point."""
    user = set(spec_of("dflash"))
    if role != "dflash_proxmox":
        user |= set(spec_of("dflash_proxmox"))
    specs = [(entry, spec) for r, entry, spec in all_specs() if r == role]
    declared = {name for _, options in specs for name in options}
    assert sorted(declared & user) == [], f"{role} declares user variables again"
    inputs = names_read(role) - names_set(role) - user
    assert sorted(inputs - declared) == [], f"{role} reads inputs its spec does not declare"
    files = role_files(role, "tasks", "templates", "defaults", "vars")
    text = "\n".join(path.read_text() for path in files)
    stale = [name for name in declared if not re.search(rf"\b{name}\b", text)]
    assert stale == [], f"{role} declares inputs it never reads"
    data = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    for entry, spec in data["argument_specs"].items():
        assert "meta/argument_specs.yml" in " ".join(spec.get("description") or []), (role, entry)


def module_takes(module: str, option: str) -> bool:
    """Whether a module of library/ has the option `root` or `token` (its own or a fragment's)."""
    text = (LIBRARY / f"{module}.py").read_text().split('EXAMPLES = r"""')[0]
    fragment = {"root": "- dflash_state_root", "token": "- dflash_deploy_lock_token"}[option]
    return fragment in text or f"\n  {option}:\n" in text


def modules_and_roles(tasks, base: Path) -> tuple[set[str], set[str]]:
    """The library modules a task list calls and the roles it imports or includes, following
    include_tasks/import_tasks files."""
    modules, roles = set(), set()
    for task in walk_tasks(tasks):
        modules.update(set(task) & MODULES)
        for key in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
            if key in task:
                roles.add(task[key]["name"])
        for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
            target = task.get(key)
            target = target.get("file") if isinstance(target, dict) else target
            if target:
                path = base / target
                more = modules_and_roles(yaml.safe_load(path.read_text()), path.parent)
                modules, roles = modules | more[0], roles | more[1]
    return modules, roles


def role_closure(roles: set[str]) -> tuple[set[str], set[str]]:
    """The modules every task file of these roles calls, and every role they reach."""
    modules, seen, todo = set(), set(), list(roles)
    while todo:
        role = todo.pop()
        if role in seen:
            continue
        seen.add(role)
        for path in role_files(role, "tasks"):
            more = modules_and_roles(yaml.safe_load(path.read_text()), path.parent)
            modules |= more[0]
            todo += more[1]
    return modules, seen


PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yml"))
TOKEN = "{{ dflash_deploy_lock_result.token | default(omit) }}"


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_every_play_gives_its_modules_root_and_token(playbook):
    """The role tasks leave out `root:` and the deploy lock's `token:`: the play says them once,
    in module_defaults, for every library module its roles call; a play that takes the lock
    hands its token to every module that checks it (the lock's own module makes its token)."""
    for play in yaml.safe_load(playbook.read_text()):
        listed = {r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])}
        modules, imported = modules_and_roles(play.get("tasks"), playbook.parent)
        more, roles = role_closure(listed | imported)
        defaults = play.get("module_defaults") or {}
        for module in sorted(modules | more):
            args = defaults.get(module) or {}
            if module_takes(module, "root"):
                assert args.get("root") == "{{ dflash_root }}", (playbook.name, module)
            locked = "dflash_deploy_lock" in roles and module != "dflash_deploy_lock"
            if locked and module_takes(module, "token"):
                assert args.get("token") == TOKEN, (playbook.name, module)


def readme_variables() -> set[str]:
    text = (REPO / "docs" / "variables.md").read_text()
    section = text.split("## User variables", 1)[1].split("\n## ", 1)[0]
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
                continue  # a play of no dflash role
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
