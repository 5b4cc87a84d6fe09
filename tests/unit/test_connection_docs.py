"""connection_plugins/: every plugin's DOCUMENTATION renders in `ansible-doc -t connection`, and
dflash_pct documents every option of the plugin it extends, with the same sources (inventory
variables, ini keys, environment), so that the parent's get_option() calls find them and an
inventory for proxmox_pct_remote works unchanged (`make lint` runs this file)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

PLUGINS = sorted((REPO / "connection_plugins").glob("*.py"))
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
PARENT = Path(
    importlib.util.find_spec(
        "ansible_collections.community.proxmox.plugins.connection.proxmox_pct_remote"
    ).origin
)


def documentation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)
    raise AssertionError(f"{path.name} has no DOCUMENTATION")


def sources(option: dict) -> dict:
    """Where an option's value comes from, and its type and default."""
    return {
        "type": {"str": "string", "bool": "boolean"}.get(option.get("type"), option.get("type")),
        "default": option.get("default"),
        **{key: option.get(key) or [] for key in ("vars", "env", "ini", "cli", "keyword")},
    }


@pytest.mark.parametrize("path", PLUGINS, ids=[p.stem for p in PLUGINS])
def test_ansible_doc_renders_it(path: Path) -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    proc = subprocess.run([str(ANSIBLE_DOC), "-t", "connection", path.stem], env=env,
                          capture_output=True, text=True, check=False, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0 and "OPTIONS" in proc.stdout, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    docs = documentation(path)
    assert docs["name"] == path.stem
    for name, option in docs["options"].items():
        assert option.get("description"), f"{path.stem}.{name} has no description"


def test_dflash_pct_keeps_every_option_of_proxmox_pct_remote() -> None:
    ours = documentation(REPO / "connection_plugins" / "dflash_pct.py")["options"]
    parent = documentation(PARENT)["options"]
    assert set(parent) <= set(ours), set(parent) - set(ours)
    for name, option in parent.items():
        assert sources(ours[name]) == sources(option), name
