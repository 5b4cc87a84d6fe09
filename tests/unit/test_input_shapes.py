"""Every list and mapping variable a user sets is refused, before any task reads it, when it
holds something else (Ansible's argument spec takes 'a,b' for a list and 'k=v' for a mapping but
leaves the variable a string): the message names the variable, what it got and an example of
the right form. The table behind it covers exactly the list and mapping variables of the user
specs (the dflash and dflash_proxmox roles')."""

from __future__ import annotations

import json

import pytest
import yaml
from dflash_input_filters import NULLABLE, SHAPES, shape_problems

from tests.helpers import REPO


def user_options() -> dict[str, dict]:
    """The user-facing variables: the dflash role's spec and dflash_proxmox's own."""
    options = {}
    for role in ("dflash", "dflash_proxmox"):
        path = REPO / "roles" / role / "meta" / "argument_specs.yml"
        options.update(yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"])
    return options


def test_the_table_holds_every_list_and_mapping_variable_with_its_type():
    specs = {n: o for n, o in user_options().items() if o["type"] in ("list", "dict")}
    assert sorted(SHAPES) == sorted(specs)
    for name, (_, example) in SHAPES.items():
        assert isinstance(example, {"list": list, "dict": dict}[specs[name]["type"]]), name
        if specs[name]["type"] == "list":
            kind = {"str": str, "int": int, "dict": dict}[specs[name]["elements"]]
            assert example and all(isinstance(item, kind) for item in example), name
        # The example passes the check it is quoted by.
        assert shape_problems({name: example}) == [], name
    assert SHAPES.keys() >= NULLABLE


def test_the_defaults_and_no_setting_pass():
    defaults = {}
    for role in ("dflash", "dflash_proxmox"):
        path = REPO / "roles" / role / "defaults" / "main.yml"
        defaults.update(yaml.safe_load(path.read_text()))
    # Templates (dflash_env_lock, dflash_controller's fields) are rendered before the check.
    plain = {n: v for n, v in defaults.items() if n in SHAPES and "{{" not in str(v)}
    assert shape_problems(plain) == []
    assert shape_problems({}) == []
    assert shape_problems({"dflash_env_lock": None, "dflash_ref": "v1"}) == []


def expected(name: str, form: str, got: str, example: object) -> str:
    return f"{name} must be {form}, got {got}; e.g. -e '{json.dumps({name: example})}'"


@pytest.mark.parametrize(
    ("name", "value", "got"),
    [
        ("dflash_trainer_args", "max_steps=100", "the string 'max_steps=100'"),
        ("dflash_trainer_env", ["NCCL_DEBUG=WARN"], "the list ['NCCL_DEBUG=WARN']"),
        ("dflash_restart_policy", None, "null"),
        ("dflash_env_lock", "3.11", "the string '3.11'"),
        ("dflash_proxmox_snapshot", True, "true"),
        ("dflash_protect_releases", "v1", "the string 'v1'"),
        ("dflash_torchrun_args", "--nnodes 2", "the string '--nnodes 2'"),
        ("dflash_torchrun_args", ["--nnodes", ["2"]], "the list ['--nnodes', ['2']]"),
        ("dflash_trainer_env_allow", {"LD_PRELOAD": True}, "the mapping {'LD_PRELOAD': True}"),
        ("dflash_proxmox_gpus", 3, "the number 3"),
        ("dflash_proxmox_gpus", [0, False], "the list [0, False]"),
        ("dflash_proxmox_mounts", ["/data"], "the list ['/data']"),
    ],
)
def test_a_wrong_type_names_the_variable_what_it_got_and_the_right_form(name, value, got):
    form, example = SHAPES[name]
    assert shape_problems({name: value}) == [expected(name, form, got, example)]


def test_each_wrong_variable_is_named_once_in_table_order():
    said = shape_problems({"dflash_trainer_env": "A=1", "dflash_trainer_args": "max_steps=100"})
    assert said == [
        "dflash_trainer_args must be a mapping of flag: value, got the string 'max_steps=100'; "
        """e.g. -e '{"dflash_trainer_args": {"max_steps": 100}}'""",
        "dflash_trainer_env must be a mapping of NAME: value, got the string 'A=1'; "
        """e.g. -e '{"dflash_trainer_env": {"NCCL_DEBUG": "WARN"}}'""",
    ]


def test_a_deployment_that_recorded_no_lock_still_renders():
    """A rollback to a history line without a lock (an old or torn line): the env's name and
    id render instead of failing the play (issue 51: `'NoneType' object has no attribute
    'items'` in dflash_lock_id)."""
    from dflash_input_filters import FilterModule

    filters = FilterModule().filters()
    lock = {"python": "3.11", "packages": {"torch": "2.13.0"}}
    assert filters["dflash_lock_id"](lock).startswith("lock-")
    assert filters["dflash_lock_id"](None) == ""
    assert filters["dflash_env_name"](None) == "(no lock recorded)"
    assert filters["dflash_env_name"](lock) == filters["dflash_lock_id"](lock)
