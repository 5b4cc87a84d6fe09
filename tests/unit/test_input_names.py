"""A variable set under a name within a couple of edits of one the toolkit reads, whatever its
prefix or case (dlfash_ref, flash_ref, dflashref, DFLASH_REF), is a typo: it gets the same "did
you mean" warning (the same error with dflash_strict_vars) as an unknown dflash_* name, where
Ansible's own variables and unrelated names get nothing."""

from __future__ import annotations

import pytest
from dflash_input_filters import edit_distance, unknown_vars

# What hostvars holds for a host besides the user's own variables: the inventory's, the
# magic ones and the proxmox_* inputs of the dflash_proxmox role.
ANSIBLE_NAMES = [
    "ansible_host", "ansible_connection", "ansible_python_interpreter", "ansible_facts",
    "ansible_playbook_python", "ansible_config_file", "ansible_version", "ansible_check_mode",
    "ansible_diff_mode", "ansible_forks", "ansible_inventory_sources", "ansible_skip_tags",
    "ansible_run_tags", "ansible_verbosity", "ansible_user", "ansible_port", "inventory_file",
    "inventory_dir", "inventory_hostname", "inventory_hostname_short", "group_names", "groups",
    "playbook_dir", "omit", "hostvars", "role_name", "proxmox_vmid", "proxmox_node",
    "proxmox_api_host", "proxmox_api_user", "proxmox_api_token_id", "proxmox_api_token_secret",
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("dlfash_ref", "dflash_ref"),  # two letters swapped
        ("flash_ref", "dflash_ref"),  # one left out
        ("dflashref", "dflash_ref"),
        ("dflash-ref", "dflash_ref"),
        ("dflsh_keep_releases", "dflash_keep_releases"),
        ("dfalsh_trainer_arg", "dflash_trainer_args"),  # two edits
        ("DFLASH_ROOT", "dflash_root"),  # Ansible's names are case-sensitive
        ("Dflash_Keep_Release", "dflash_keep_releases"),
    ],
)
def test_a_name_near_a_known_one_warns_whatever_its_prefix(name, meant):
    said = unknown_vars([name])
    assert said == [f"{name} is set but unknown to dflash-deploy (did you mean {meant}?)"]


def test_ansible_variables_and_unrelated_names_get_nothing():
    assert unknown_vars([*ANSIBLE_NAMES, "my_var", "flash", "dflash", "refs"]) == []


def test_known_names_and_unknown_dflash_names_as_before():
    assert unknown_vars(["dflash_ref", "dflash_root", "ansible_host"]) == []
    assert unknown_vars(["dflash_keep_release", "dflash_zzzz_qqqq"]) == [
        "dflash_keep_release is set but unknown to dflash-deploy "
        "(did you mean dflash_keep_releases?)",
        "dflash_zzzz_qqqq is set but unknown to dflash-deploy (no dflash role reads it)",
    ]


def test_the_pct_connections_options_are_known():
    """Its variables are read by connection_plugins/dflash_pct.py, not by a role (a bench run
    warned about dflash_pct_control_path_dir)."""
    options = ["dflash_pct_control_path_dir", "dflash_pct_ssh_transport"]
    assert unknown_vars(options) == []
    assert unknown_vars(["dflash_pct_control_path_dirs"]) == [
        "dflash_pct_control_path_dirs is set but unknown to dflash-deploy "
        "(did you mean dflash_pct_control_path_dir?)"
    ]


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("dflash_ref", "dflash_ref", 0),
        ("dlfash_ref", "dflash_ref", 1),
        ("flash_ref", "dflash_ref", 1),
        ("dflash_rfe", "dflash_ref", 1),
        ("dflsh_rf", "dflash_ref", 2),
        ("dflash_r", "dflash_ref", 2),
        ("ansible_host", "dflash_root", 3),  # over the limit: limit + 1
        ("", "abc", 3),
        ("ab", "", 2),
    ],
)
def test_edit_distance(a, b, distance):
    assert edit_distance(a, b, 2) == min(distance, 3)
