#!/usr/bin/python
# Unpacks a pushed release archive into releases/<id> on the target, all or nothing.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_unpack
short_description: Unpack a dflash release archive into releases/<id>, atomically
description:
  - Extracts the archive into a temp folder next to the releases, checks every file against
    the archive's MANIFEST.json and the expected tree hash, then renames the folder to
    C(releases/<release>). A kill at any point leaves either no release or a complete one.
  - When C(releases/<release>) already exists with the expected tree hash nothing changes; with
    another tree hash the module fails (a moved tag) rather than mixing two trees.
  - A release whose files differ from its manifest (edited by hand), or any release with
    I(replace), is unpacked again from the archive; the edited folder is kept as
    C(releases/.edited-<release>-<time>) and its changed files are named in the result.
  - Removes temp folders left by killed earlier runs and the pushed archive once unpacked.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
  - dflash_deploy_lock_token.takes_the_lock
options:
  release:
    description: Release id.
    type: str
    required: true
  tree_sha256:
    description: Tree hash the unpacked release must have.
    type: str
    required: true
  archive:
    description: Path of the pushed archive on the target (needed when the release is new or
      is unpacked again).
    type: path
  src:
    description:
      - Path of the archive on the controller. The action plugin sends it to I(archive) first
        (one command with the archive on its standard input where the connection pipelines),
        then runs the module; the module itself does not read it.
      - Not sent in check mode.
    type: path
  replace:
    description: Unpack again even when the release on the target matches its manifest.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Unpack the release
  dflash_unpack:
    root: /opt/dflash
    release: v1.4.0
    tree_sha256: "{{ build.tree_sha256 }}"
    archive: /opt/dflash/.incoming/v1.4.0.tar.gz

- name: Push the archive built on the controller and unpack it
  dflash_unpack:
    root: /opt/dflash
    release: v1.4.0
    tree_sha256: "{{ build.tree_sha256 }}"
    src: "{{ build.archive }}"
    archive: /opt/dflash/.incoming/v1.4.0.tar.gz
"""

RETURN = r"""
path:
  description: Folder of the release on the target.
  type: str
  returned: success
file_count:
  description: Number of files checked against the manifest.
  type: int
  returned: when unpacked
removed_temp:
  description: Temp folders of earlier interrupted runs that were removed.
  type: list
  elements: str
  returned: success
repaired:
  description: C(changed), C(missing), C(extra) files of the edited release, and C(kept_at)
    (where the edited folder was moved).
  type: dict
  returned: when an edited release was unpacked again
"""

import contextlib
import os
import shutil
import tarfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, held
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import (
    MANIFEST_NAME,
    file_drift,
    sha256_file,
    tree_sha256,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    TMP_PREFIX,
    StateError,
    fsync_dir,
    read_manifest,
    release_dir,
    stale_temp_dirs,
)


def safe_members(tar: tarfile.TarFile, archive: str) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    for member in members:
        name = member.name
        if (
            name.startswith("/")
            or ".." in name.split("/")
            or not (member.isfile() or member.isdir())
        ):
            raise StateError(
                f"archive {archive} holds an unsafe entry '{name}'; rebuild it with deploy.yml"
            )
    return members


def check_unpacked(folder: str, expected_tree: str) -> int:
    manifest = read_manifest(folder)
    if manifest is None:
        raise StateError(f"the archive has no readable {MANIFEST_NAME}; rebuild it with deploy.yml")
    files = manifest.get("files", {})
    for rel, sha in files.items():
        path = os.path.join(folder, rel)
        if not os.path.isfile(path) or sha256_file(path) != sha:
            raise StateError(f"{rel} in the archive does not match its manifest; push it again")
    if (
        tree_sha256(files) != manifest.get("tree_sha256")
        or manifest["tree_sha256"] != expected_tree
    ):
        raise StateError(
            f"the archive's tree hash {manifest.get('tree_sha256')} is not the expected "
            f"{expected_tree}; push it again"
        )
    return len(files)


def unpack(root: str, release: str, archive: str, expected_tree: str) -> int:
    """Extract into a temp folder, check it, rename it to releases/<release>; a release folder
    already there (an edited one) is moved aside first, kept under `.edited-`."""
    target = release_dir(root, release)
    tmp = os.path.join(os.path.dirname(target), f"{TMP_PREFIX}{release}-{os.getpid()}")
    try:
        with tarfile.open(archive) as tar:
            # Members are checked above; the "data" filter (where this Python has it) is a
            # second guard. Debian 12's stock Python 3.11.2 predates it.
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, members=safe_members(tar, archive), **extra)
        count = check_unpacked(tmp, expected_tree)
        if os.path.lexists(target):
            aside = os.path.join(
                os.path.dirname(target), f".edited-{release}-{time.strftime('%Y%m%dT%H%M%S')}"
            )
            os.rename(target, aside)
        os.rename(tmp, target)
        fsync_dir(os.path.dirname(target))
    except (OSError, tarfile.TarError) as err:
        raise StateError(f"cannot unpack {archive} into {target}: {err}") from err
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
    return count


def run(module: AnsibleModule) -> dict:
    root, release = module.params["root"], module.params["release"]
    expected, archive = module.params["tree_sha256"], module.params["archive"]
    target = release_dir(root, release)
    existing = read_manifest(target)
    result: dict = {"changed": False, "path": target, "removed_temp": []}
    drift: dict = {}
    if existing is not None:
        if existing.get("tree_sha256") != expected:
            raise StateError(
                f"release {release} on the target has tree {existing.get('tree_sha256')}, the "
                f"build has {expected}: the tag was moved. Deploy under a new tag, or remove "
                f"{target} if it is not current"
            )
        drift = file_drift(target, existing)
        if not any(drift.values()) and not module.params["replace"]:
            return result
    result["changed"] = True
    if module.check_mode:
        return result
    if not archive or not os.path.isfile(archive):
        raise StateError(f"release {release} needs its archive on the target; none was pushed")
    with held(root, module.params["token"], "deploy", "unpack"):
        for stale in stale_temp_dirs(root):
            shutil.rmtree(stale, ignore_errors=True)
            result["removed_temp"].append(stale)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        before = set(os.listdir(os.path.dirname(target)))
        result["file_count"] = unpack(root, release, archive, expected)
        kept = sorted(set(os.listdir(os.path.dirname(target))) - before - {release})
    if any(drift.values()):
        result["repaired"] = dict(drift, kept_at=[os.path.join(os.path.dirname(target), k)
                                                  for k in kept])  # fmt: skip
        module.warn(
            f"release {release} on the target had been edited (changed {drift['changed']}, "
            f"missing {drift['missing']}, extra {drift['extra']}); it was unpacked again from "
            f"its archive, the edited copy kept at {', '.join(result['repaired']['kept_at'])}"
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(archive)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            release={"type": "str", "required": True},
            tree_sha256={"type": "str", "required": True},
            archive={"type": "path"},
            src={"type": "path"},
            replace={"type": "bool", "default": False},
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except (StateError, LockError) as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
