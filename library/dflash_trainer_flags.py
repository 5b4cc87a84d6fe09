#!/usr/bin/python
# Checks a deployment's trainer flags with the parser of the very release being deployed, on the
# controller, before anything changes on a target.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_trainer_flags
short_description: Check trainer flags against the release's own parser
description:
  - Runs on the controller (delegate_to localhost). Takes the Python files of C(dflash/) out of
    the built release archive and runs C(python -m dflash.flags check train FLAGS) with them,
    isolated from the controller's own packages; it needs only the standard library, no torch.
  - Names every unknown flag (with the closest known one) and every value of the wrong type,
    as the trainer itself would refuse them at start.
  - Also returns the release's own description of its flags (C(python -m dflash.flags describe
    train)), which the toolkit reads instead of keeping a copy - the flags that shape a training
    step, their defaults, the flags a launcher sets.
  - With I(supervise), checks run.sh's flags of the supervisor (the restart policy) the same
    way, with C(python -m dflash.flags check supervise); the policy's keys, bounds and defaults
    are the release's own.
  - Also returns the release's other contracts (C(python -m dflash.contracts)) - the store
    format it reads, which preflight holds the store named by C(dflash_data) to.
  - A release older than C(dflash/flags.py) cannot be checked; the result says so.
options:
  archive:
    description: The release archive built by M(dflash_release_build).
    type: path
    required: true
  flags:
    description: The flags as run.sh passes them, one C([flag]) or C([flag, value]) per item.
    type: list
    elements: list
    required: true
  supervise:
    description:
      - The supervisor's flags as run.sh passes them, one C([flag, value]) per item; left out,
        they are not checked.
    type: list
    elements: list
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
    details: Reads the archive and runs the check; changes nothing anywhere.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Check the trainer flags against the release
  dflash_trainer_flags:
    archive: .build/releases/v1.4.0.tar.gz
    flags: [["--max-steps", "100"], ["--compile-drafter"]]
  delegate_to: localhost
"""

RETURN = r"""
checked:
  description: Whether the release had a parser to check with.
  type: bool
  returned: always
problems:
  description: One message per bad flag; empty when the release's parser accepts them all.
  type: list
  elements: str
  returned: always
schema:
  description:
    - The release's flags (C(flags) by name - C(flag), C(type), C(default), C(help),
      C(workload), C(compiled), C(launcher) - and C(token_budget), its defaults by device);
      null for a release that cannot describe them.
  type: dict
  returned: always
contracts:
  description:
    - The release's contracts (C(python -m dflash.contracts)) - C(status) and C(supervisor)
      (their states and what each means), C(store) (C(format), C(version), C(manifest),
      C(arrays), C(summary_keys)) and C(flags); null for a release from before them.
  type: dict
  returned: always
supervise:
  description:
    - The check of I(supervise) - C(checked) (false for a release whose dflash/flags.py has no
      supervisor's policy), C(problems) and C(schema), as above.
  type: dict
  returned: when I(supervise) is given
"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule

NEEDED = ("dflash/__init__.py", "dflash/flags.py")


def check(archive: str, argv: list[str], supervise: list[str] | None = None) -> dict:
    with (
        tarfile.open(archive) as tar,
        tempfile.TemporaryDirectory(prefix="dflash-flags-") as folder,
    ):
        if not set(NEEDED) <= set(tar.getnames()):
            return {"checked": False, "problems": [], "schema": None, "contracts": None}
        _extract_package(tar, folder)
        result = _checked(folder, archive, "train", argv)
        if supervise is not None:
            result["supervise"] = _checked(folder, archive, "supervise", supervise)
        result["contracts"] = _contracts(folder)
    return result


def _extract_package(tar: tarfile.TarFile, folder: str) -> None:
    """The release's Python files of dflash/ (stdlib-only ones are all that run here)."""
    for member in tar.getmembers():
        parts = member.name.split("/")
        if parts[0] != "dflash" or ".." in parts or not member.isfile():
            continue
        if not member.name.endswith(".py"):
            continue
        os.makedirs(os.path.join(folder, *parts[:-1]), exist_ok=True)
        source = tar.extractfile(member)
        assert source is not None
        with open(os.path.join(folder, *parts), "wb") as handle:
            handle.write(source.read())


def _contracts(folder: str) -> dict | None:
    """The release's own contracts (python -m dflash.contracts), or None for a release from
    before them."""
    if not os.path.isfile(os.path.join(folder, "dflash", "contracts.py")):
        return None
    proc = _run(folder, "dflash.contracts")
    if proc.returncode != 0:
        raise RuntimeError(
            f"the release's dflash.contracts exited {proc.returncode}: {proc.stderr[-1000:]}"
        )
    return json.loads(proc.stdout)


def _checked(folder: str, archive: str, command: str, argv: list[str]) -> dict:
    # A release from before `describe`, or before the command, answers with its usage (exit 2).
    described = _flags(folder, "describe", command)
    if command != "train" and described.returncode != 0:
        return {"checked": False, "problems": [], "schema": None}
    proc = _flags(folder, "check", command, *argv)
    if proc.returncode not in (0, 2):
        raise RuntimeError(
            f"the release's dflash.flags ({archive}) exited {proc.returncode} before it could judge"
            f" the flags, so this release's package does not even import: {proc.stderr[-1000:]}"
        )
    schema = json.loads(described.stdout) if described.returncode == 0 else None
    return {"checked": True, "problems": proc.stderr.strip().splitlines(), "schema": schema}


def _flags(folder: str, *args: str) -> subprocess.CompletedProcess:
    return _run(folder, "dflash.flags", *args)


def _run(folder: str, module: str, *args: str) -> subprocess.CompletedProcess:
    # -E -s: none of the controller's PYTHON* variables or user site packages.
    return subprocess.run(
        [sys.executable, "-E", "-s", "-B", "-m", module, *args],
        cwd=folder, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "archive": {"type": "path", "required": True},
            "flags": {"type": "list", "elements": "list", "required": True},
            "supervise": {"type": "list", "elements": "list"},
        },
        supports_check_mode=True,
    )
    argv = [str(word) for group in module.params["flags"] for word in group]
    groups = module.params["supervise"]
    supervise = None if groups is None else [str(word) for group in groups for word in group]
    try:
        module.exit_json(changed=False, **check(module.params["archive"], argv, supervise))
    except (OSError, ValueError, tarfile.TarError, RuntimeError, subprocess.SubprocessError) as err:
        module.fail_json(
            msg=f"cannot check the trainer flags: {err}\nNothing was changed on the target; fix"
            " the release and deploy it again."
        )


if __name__ == "__main__":
    main()
