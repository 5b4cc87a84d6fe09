#!/usr/bin/python
# Builds a release archive of dflash/ on the controller from a git ref or the working tree.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_release_build
short_description: Build a reproducible release archive of the dflash/ trainer package
description:
  - Runs on the controller (delegate_to localhost). Reads C(dflash/) from a git ref (tag, branch,
    commit) or from the working tree, writes C(<build_dir>/<release>.tar.gz) holding the package
    and a C(MANIFEST.json), and returns the release id and tree hash.
  - The archive is byte-for-byte reproducible, so a rebuild of the same tree reports no change.
  - Release id is the tag name when I(ref) is a tag, C(g<commit12>) for any other commit or a
    clean working tree, and C(wt-<tree12>) for a working tree whose dflash/ differs from HEAD.
options:
  source_dir:
    description: Checkout that holds C(dflash/) (and C(.git) when I(ref) is given).
    type: path
    required: true
  ref:
    description: Git tag, branch or commit to build; empty builds the working tree.
    type: str
    default: ""
  build_dir:
    description: Controller folder for the archives.
    type: path
    required: true
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
    details: Writes only the controller's build folder, never a target; runs in check mode too.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Build the release of tag v1.4.0
  dflash_release_build:
    source_dir: "{{ playbook_dir }}/.."
    ref: v1.4.0
    build_dir: "{{ playbook_dir }}/../.build/releases"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
release:
  description: Release id.
  type: str
  returned: success
  sample: g1a2b3c4d5e6f
tree_sha256:
  description: Tree hash of the package (MANIFEST.json definition).
  type: str
  returned: success
cache_code:
  description:
    - What of the release's code names its compile cache folder, with the versions and the GPU.
    - C(compiled_sha256), the hash of the files that C(dflash/compiled.py) lists (those the
      compiled step is traced from); for a release without that file, C(tree_sha256), its
      whole tree.
  type: dict
  returned: success
  sample: {compiled_sha256: 5d1c0a...}
archive:
  description: Path of the archive on the controller.
  type: str
  returned: success
archive_sha256:
  description: sha256 of the archive bytes.
  type: str
  returned: success
target_bytes:
  description: Bytes the release takes on a target while it is unpacked (archive and files).
  type: int
  returned: success
manifest:
  description: The MANIFEST.json content.
  type: dict
  returned: success
"""

import io
import os
import subprocess
import tarfile
import time
from datetime import UTC, datetime

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    COMPILED_LIST,
    CompiledListError,
    code_key,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import (
    PACKAGE_DIR,
    build_archive,
    is_ignored_path,
    release_id_problem,
    sha256_bytes,
    sha256_file,
    tree_sha256,
)


class BuildError(Exception):
    pass


def git(source_dir: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["git", "-C", source_dir, *args], capture_output=True, check=False)
    except FileNotFoundError:
        # A controller without git can still deploy a working tree (no ref).
        proc = subprocess.CompletedProcess(["git", *args], 127, b"", b"git is not installed")
    if check and proc.returncode != 0:
        raise BuildError(
            f"git {' '.join(args)} failed in {source_dir}: {proc.stderr.decode().strip()}"
        )
    return proc


def is_git_checkout(source_dir: str) -> bool:
    return git(source_dir, "rev-parse", "--git-dir", check=False).returncode == 0


def resolve_ref(source_dir: str, ref: str) -> tuple[str, bool]:
    """(commit, is_tag) for a user-given ref, or a BuildError naming it."""
    if not is_git_checkout(source_dir):
        raise BuildError(
            f"dflash_ref '{ref}' needs a git checkout, but {source_dir} is not one; "
            "leave dflash_ref empty to deploy the working tree"
        )
    proc = git(source_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise BuildError(
            f"dflash_ref '{ref}' is not a tag, branch or commit in {source_dir}; "
            "list candidates with `git tag` / `git log --oneline`, or leave dflash_ref empty "
            "to deploy the working tree"
        )
    is_tag = (
        git(
            source_dir, "show-ref", "--verify", "--quiet", f"refs/tags/{ref}", check=False
        ).returncode
        == 0
    )
    return proc.stdout.decode().strip(), is_tag


def files_at_commit(source_dir: str, commit: str) -> dict[str, tuple[bytes, int]]:
    archive = git(source_dir, "archive", "--format=tar", commit, "--", PACKAGE_DIR, check=False)
    if archive.returncode != 0:
        raise BuildError(
            f"commit {commit[:12]} has no {PACKAGE_DIR}/ folder in {source_dir}; "
            "choose a ref that contains the trainer package"
        )
    contents: dict[str, tuple[bytes, int]] = {}
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            if member.isfile() and not is_ignored_path(member.name):
                data = tar.extractfile(member).read()
                contents[member.name] = (data, member.mode)
    return contents


def working_tree_paths(source_dir: str) -> list[str]:
    if is_git_checkout(source_dir):
        listed = git(
            source_dir,
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            PACKAGE_DIR,
        ).stdout.decode()
        paths = [p for p in listed.split("\0") if p]
    else:
        root = os.path.join(source_dir, PACKAGE_DIR)
        paths = [
            os.path.relpath(os.path.join(folder, name), source_dir).replace(os.sep, "/")
            for folder, _dirs, names in os.walk(root)
            for name in names
        ]
    # Tracked files deleted on disk are not part of the working tree; links are left out as
    # git archive and the trainer's own tree hash leave them out.
    return sorted(
        p
        for p in paths
        if not is_ignored_path(p)
        and os.path.isfile(os.path.join(source_dir, p))
        and not os.path.islink(os.path.join(source_dir, p))
    )


def files_in_working_tree(source_dir: str) -> dict[str, tuple[bytes, int]]:
    contents: dict[str, tuple[bytes, int]] = {}
    for rel in working_tree_paths(source_dir):
        full = os.path.join(source_dir, rel)
        with open(full, "rb") as handle:
            contents[rel] = (handle.read(), os.stat(full).st_mode)
    if not contents:
        raise BuildError(
            f"{os.path.join(source_dir, PACKAGE_DIR)} holds no files; "
            "set dflash_source_dir to the checkout that contains the trainer package"
        )
    return contents


def commit_time(source_dir: str, commit: str) -> int:
    return int(git(source_dir, "show", "-s", "--format=%ct", commit).stdout.decode().strip())


def plan_release(source_dir: str, ref: str) -> tuple[dict[str, tuple[bytes, int]], dict, int]:
    """Contents, manifest and archive mtime of the release that `ref` names."""
    if ref:
        commit, is_tag = resolve_ref(source_dir, ref)
        contents = files_at_commit(source_dir, commit)
        release = ref if is_tag else f"g{commit[:12]}"
        dirty = False
        mtime = commit_time(source_dir, commit)
    else:
        contents = files_in_working_tree(source_dir)
        commit = None
        dirty = True
        mtime = max(int(os.stat(os.path.join(source_dir, p)).st_mtime) for p in contents)
        if is_git_checkout(source_dir):
            head = git(source_dir, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
            if head.returncode == 0:
                commit = head.stdout.decode().strip()
                status = git(source_dir, "status", "--porcelain", "--", PACKAGE_DIR)
                dirty = bool(status.stdout.strip())
                if not dirty:
                    mtime = commit_time(source_dir, commit)
        release = None if dirty else f"g{commit[:12]}"
    files = {path: sha256_bytes(data) for path, (data, _mode) in contents.items()}
    tree = tree_sha256(files)
    release = release or f"wt-{tree[:12]}"
    problem = release_id_problem(release)
    if problem:
        raise BuildError(
            f"release id '{release}' (from dflash_ref '{ref}') cannot be used: {problem}; "
            "tag the commit with a plain name such as v1.4.0 and deploy that tag"
        )
    manifest = {
        "release": release,
        "ref": ref or "WORKTREE",
        "commit": commit,
        "dirty": dirty,
        "created": datetime.fromtimestamp(mtime, tz=UTC).isoformat(),
        "files": files,
        "tree_sha256": tree,
    }
    return contents, manifest, mtime


def write_if_changed(path: str, data: bytes) -> bool:
    if os.path.isfile(path) and sha256_file(path) == sha256_bytes(data):
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "source_dir": {"type": "path", "required": True},
            "ref": {"type": "str", "default": ""},
            "build_dir": {"type": "path", "required": True},
        },
        # Builds only into the controller's build folder, never on a target: safe in check mode.
        supports_check_mode=True,
    )
    source_dir = module.params["source_dir"]
    ref = module.params["ref"].strip()
    if not os.path.isdir(os.path.join(source_dir, PACKAGE_DIR)):
        module.fail_json(
            msg=f"dflash_source_dir '{source_dir}' has no {PACKAGE_DIR}/ folder; "
            "point it at the dflash-deploy checkout"
        )
    try:
        contents, manifest, mtime = plan_release(source_dir, ref)
    except BuildError as err:
        module.fail_json(msg=str(err))
    try:
        listed = contents.get(COMPILED_LIST)
        cache_code = code_key(manifest["files"], listed[0] if listed else None)
    except (CompiledListError, SyntaxError, ValueError) as err:
        module.fail_json(msg=f"release {manifest['release']}: {err}")
    data = build_archive(contents, manifest, mtime)
    archive = os.path.join(module.params["build_dir"], f"{manifest['release']}.tar.gz")
    changed = write_if_changed(archive, data)
    module.exit_json(
        changed=changed,
        release=manifest["release"],
        tree_sha256=manifest["tree_sha256"],
        cache_code=cache_code,
        archive=archive,
        archive_sha256=sha256_bytes(data),
        manifest={k: v for k, v in manifest.items() if k != "files"},
        file_count=len(manifest["files"]),
        # What the release takes on a target, its archive while it is pushed included.
        target_bytes=len(data) + sum(len(blob) for blob, _mode in contents.values()),
    )


if __name__ == "__main__":
    main()
