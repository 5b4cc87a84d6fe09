#!/usr/bin/python
# Fills a wheelhouse folder with the wheels a lock pins (run where the wheelhouse lives).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_wheelhouse
short_description: Download the wheels of a dflash lock into a wheelhouse folder
description:
  - Downloads every pinned wheel the folder lacks with C(pip download --no-deps
    --only-binary=:all:), checked against the lock's hashes where it has them, plus the wheels
    of uv and pip, the installers the env build runs from the wheelhouse (no pip or uv needed
    on the target).
  - Wheels already there are not downloaded again; with nothing missing the module changes
    nothing. Runs where the wheelhouse is (the controller, or a Proxmox node that mounts it
    into the containers), with that machine's pip and its index configuration.
options:
  lock:
    description: The lock (see docs/environment-lock.md).
    type: dict
    required: true
  dest:
    description: The wheelhouse folder (created when missing).
    type: path
    required: true
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
    details: In check mode names the wheels it would download and downloads none.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Fill the wheelhouse
  dflash_wheelhouse:
    lock: "{{ dflash_env_lock }}"
    dest: /srv/wheelhouse
  delegate_to: localhost
"""

RETURN = r"""
downloaded:
  description: Requirements that were downloaded.
  type: list
  elements: str
  returned: always
"""

import glob
import os
import subprocess
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    lock_problems,
    pinned,
    requirement_lines,
    wheel_name_version,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_installer import UV_VERSION


def present(dest: str) -> set[tuple[str, str]]:
    return {
        parsed
        for path in glob.glob(os.path.join(dest, "*.whl"))
        if (parsed := wheel_name_version(os.path.basename(path)))
    }


def download(module: AnsibleModule, dest: str, lines: list[str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(lines) + "\n")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", dest, "-r", handle.name,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    finally:
        os.unlink(handle.name)
    if proc.returncode != 0:
        names = ", ".join(line.split(" ")[0] for line in lines)
        module.fail_json(
            msg=f"pip download of {names} failed; check the lock's versions and hashes and "
            f"this machine's index: {proc.stderr[-2000:]}",
            cmd=cmd,
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "lock": {"type": "dict", "required": True},
            "dest": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    lock, dest = module.params["lock"], module.params["dest"]
    problems = lock_problems(lock, unhashed_ok=True)
    if problems:
        module.fail_json(msg="; ".join(problems))
    have = present(dest) if os.path.isdir(dest) else set()
    missing = [f"{n}=={v}" for n, v in sorted(pinned(lock).items()) if (n, v) not in have]
    # The installers, not part of any env: uv (the one the controller resolves with), pip
    # where uv does not run on the target.
    installers = [
        wanted
        for name, wanted in (("pip", "pip"), ("uv", f"uv=={UV_VERSION}"))
        if not any(have_name == name for have_name, _version in have)
    ]
    missing += installers
    if not missing or module.check_mode:
        module.exit_json(changed=bool(missing), downloaded=missing)
    os.makedirs(dest, exist_ok=True)
    # With the lock's hashes pip checks each download against them; the installers are
    # fetched on their own, unhashed.
    pinned_lines = [line for line in requirement_lines(lock) if line.split(" ")[0] in missing]
    for batch in (pinned_lines, installers):
        if batch:
            download(module, dest, batch)
    module.exit_json(changed=True, downloaded=missing)


if __name__ == "__main__":
    main()
