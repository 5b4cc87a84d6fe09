#!/usr/bin/python
# The live state of one target as one JSON document, in one call; never changes anything.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_facts
short_description: Read the whole dflash state of a target in one call
description:
  - Read-only. Returns the state root, the C(current) release and its manifest, the files of
    C(current) checked against that manifest (changed, missing, extra), the unpacked releases,
    the deployment history and the default rollback target.
options:
  root:
    description: State root on the target.
    type: path
    required: true
  checksums:
    description: Hash every file of C(current) against its manifest.
    type: bool
    default: true
  history_limit:
    description: How many of the newest history entries to return.
    type: int
    default: 50
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Read the target's state
  dflash_facts:
    root: /opt/dflash
  register: state
"""

RETURN = r"""
root_exists:
  description: Whether the state root exists.
  type: bool
  returned: always
root_parent_exists:
  description: Whether the folder that holds the state root exists.
  type: bool
  returned: always
current:
  description: C(release), C(link) (the raw link text), C(dangling), C(manifest) (no file list).
  type: dict
  returned: always
files:
  description: C(changed), C(missing) and C(extra) paths of C(current) against its manifest.
  type: dict
  returned: when checksums and current exists
releases:
  description: Complete releases on the target.
  type: list
  elements: str
  returned: always
release_trees:
  description: Tree hash of each complete release, by release id.
  type: dict
  returned: always
history:
  description: The newest history.jsonl entries, oldest first.
  type: list
  elements: dict
  returned: always
previous_deployment:
  description: The default rollback target (the release deployed before current).
  type: str
  returned: always
gpus:
  description: GPUs visible in the target (index, name, uuid, driver); null without nvidia-smi.
  type: list
  elements: dict
  returned: always
run_sh:
  description: C(path), C(content) and C(sha256) of run.sh (content null when missing).
  type: dict
  returned: always
"""

import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dflash_release import file_drift, sha256_bytes, tree_sha256
from ansible.module_utils.dflash_state import (
    CURRENT,
    RELEASES,
    current_release,
    list_releases,
    previous_deployment,
    read_history,
    read_manifest,
    stale_temp_dirs,
)


def gpus() -> list[dict] | None:
    """The GPUs this container sees (nvidia-smi), or None where there is no nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run(
        [smi, "--query-gpu=index,name,uuid,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    found = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            found.append({"index": int(parts[0]), "name": parts[1], "uuid": parts[2],
                          "driver": parts[3]})  # fmt: skip
    return found


def run_script(root: str) -> dict:
    path = os.path.join(root, "run.sh")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {"path": path, "content": None, "sha256": None}
    return {"path": path, "content": data.decode(errors="replace"), "sha256": sha256_bytes(data)}


def gather(root: str, checksums: bool, history_limit: int) -> dict:
    release, link = current_release(root)
    available = list_releases(root)
    history = read_history(root)
    facts: dict = {
        "root": root,
        "root_exists": os.path.isdir(root),
        "root_parent_exists": os.path.isdir(os.path.dirname(os.path.normpath(root))),
        "current": {
            "release": release,
            "link": link,
            "dangling": link is not None and release is None,
            "manifest": None,
        },
        "releases": available,
        "release_trees": {
            name: (read_manifest(os.path.join(root, RELEASES, name)) or {}).get("tree_sha256")
            for name in available
        },
        "history": history[-history_limit:] if history_limit > 0 else [],
        "previous_deployment": previous_deployment(history, release, available),
        "stale_temp": stale_temp_dirs(root),
        "gpus": gpus(),
        "run_sh": run_script(root),
    }
    if release:
        folder = os.path.join(root, RELEASES, release)
        manifest = read_manifest(folder) or {}
        facts["current"]["manifest"] = {k: v for k, v in manifest.items() if k != "files"}
        # A hand-edited MANIFEST.json would hide edited files: its own hash must still add up.
        facts["current"]["manifest_consistent"] = tree_sha256(
            manifest.get("files", {})
        ) == manifest.get("tree_sha256")
        facts["current"]["path"] = os.path.join(root, CURRENT)
        if checksums:
            facts["files"] = file_drift(folder, manifest)
    return facts


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "checksums": {"type": "bool", "default": True},
            "history_limit": {"type": "int", "default": 50},
        },
        supports_check_mode=True,
    )
    params = module.params
    module.exit_json(
        changed=False, **gather(params["root"], params["checksums"], params["history_limit"])
    )


if __name__ == "__main__":
    main()
