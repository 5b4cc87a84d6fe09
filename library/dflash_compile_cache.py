#!/usr/bin/python
# The target side of the compile cache step (roles/dflash_compile_cache): clear or keep the
# cache of this build, make sure its folder exists, say whether a warmup must run, record what
# built it once the warmup (dflash_warmup, one GPU a task) completed, and pack it for the other
# hosts of its fingerprint or unpack another host's. The rules are
# module_utils/dflash_compile_cache.py's and module_utils/dflash_cache_share.py's.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_compile_cache
short_description: Prepare the compile cache of a dflash build, or record what built it
description:
  - The cache of a build is C(<root>/cache/<fingerprint>), named on the controller from the
    torch, Triton and CUDA of the env lock, the GPU model and driver, and the hash of the files
    the release's compiled step is traced from (C(dflash/compiled.py)).
  - C(state=prepared) removes the cache first when I(clear) is set (with I(clear_all), the
    caches of every fingerprint), creates the folder when missing, moves aside the files that
    differ from the hashes recorded when they were compiled (with I(code_dir), by the release's
    C(python -m dflash.cache_files repair); to C(<cache_dir>.failed-<UTC time>)), and answers
    whether a warmup must run (I(wanted) differs from the marker C(built-by.json), or files
    were moved aside).
  - C(state=recorded) writes the marker after a warmup, whole or not at all.
  - C(state=packed) writes the cache (entries and marker, no temp or lock files) into
    I(archive), whole or not at all, for the other hosts of the same fingerprint.
  - C(state=unpacked) takes another host's I(archive) when its marker equals I(wanted) (else
    it answers C(refused) and changes nothing); new entries are renamed into place one by one,
    then the marker is written; the archive is removed either way.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
  - dflash_deploy_lock_token.takes_the_lock
options:
  cache_dir:
    description: The cache folder of this build, under C(<root>/cache).
    type: path
    required: true
  state:
    description:
      - C(prepared) clears (when asked) and creates the folder; C(recorded) writes the marker;
        C(packed) and C(unpacked) share it between hosts through I(archive).
    type: str
    choices: [prepared, recorded, packed, unpacked]
    default: prepared
  clear:
    description: Remove the cache before use.
    type: bool
    default: false
  clear_all:
    description: With I(clear), remove the caches of every fingerprint (C(<root>/cache)).
    type: bool
    default: false
  wanted:
    description:
      - What the cache must be built by (the fingerprint's fields and the warmup's flags); with
        C(state=prepared) it decides C(warm_needed), with C(state=recorded) it is written.
    type: dict
  archive:
    description: The archive C(state=packed) writes and C(state=unpacked) reads, on the target.
    type: path
  code_dir:
    description:
      - The release being deployed, whose C(dflash/cache_files.py) checks the cache's files
        against their recorded hashes (C(state=prepared)); a release without it, or none
        given, checks nothing.
    type: path
attributes:
  check_mode:
    support: full
    details: Says what it would remove, create or record; changes nothing.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Prepare the compile cache
  dflash_compile_cache:
    root: /opt/dflash
    cache_dir: /opt/dflash/cache/0123456789abcdef
    clear: true
    wanted: {torch: 2.11.0+cu130, triton: 3.6.0, cuda: "13.0", gpu: NVIDIA H200, tree_sha256: abc}
"""

RETURN = r"""
done:
  description: What was removed or created, one line each.
  type: list
  elements: str
  returned: always
moved_aside:
  description:
    - Where the files that differ from their recorded hashes went (C(state=prepared));
      null when none did.
  type: str
  returned: state=prepared
warm_needed:
  description: Whether the marker does not record I(wanted) (state=prepared with wanted).
  type: bool
  returned: when wanted is given
archive_sha256:
  description: sha256 of the archive written.
  type: str
  returned: state=packed
refused:
  description: Why the archive was not taken (another build's cache); absent when it was.
  type: str
  returned: state=unpacked, when refused
"""

import os
import tarfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_cache_share import (
    pack,
    refusal,
    unpack,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    mark,
    prepare,
    repair,
    warm_needed,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import LockError, held
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import sha256_file
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import CACHE


def share(module: AnsibleModule, cache_dir: str) -> dict:
    """state=packed and state=unpacked."""
    params = module.params
    archive, root = params["archive"], params["root"]
    if params["state"] == "packed":
        if module.check_mode:
            return {"changed": True, "done": [f"would pack {cache_dir} into {archive}"]}
        packed = pack(cache_dir, archive)
        return {
            "changed": True,
            "archive_sha256": sha256_file(archive),
            "done": [f"packed {packed['files']} files of {cache_dir} ({packed['bytes']} bytes)"],
        }
    if module.check_mode and not os.path.exists(archive):  # check mode pushed nothing
        return {"changed": True, "done": [f"would add the compiled entries of {archive}"]}
    try:
        why = refusal(archive, params["wanted"])
        if why or module.check_mode:
            return {"changed": not why, "done": [], **({"refused": why} if why else {})}
        with held(root, params["token"], "deploy", "compile cache"):
            added = unpack(archive, cache_dir, params["wanted"])
        return {"changed": True, "done": [f"added {added} compiled entries to {cache_dir}"]}
    finally:
        if not module.check_mode and os.path.exists(archive):
            os.unlink(archive)


def run(module: AnsibleModule) -> dict:
    params = module.params
    root, cache_dir = params["root"], os.path.normpath(params["cache_dir"])
    if os.path.dirname(cache_dir) != os.path.join(os.path.normpath(root), CACHE):
        module.fail_json(msg=f"cache_dir {cache_dir} is not a folder of {root}/{CACHE}")
    if params["state"] in ("packed", "unpacked"):
        return share(module, cache_dir)
    if params["state"] == "recorded":
        if not module.check_mode:
            with held(root, params["token"], "deploy", "compile cache"):
                mark(cache_dir, params["wanted"])
        return {"changed": True, "done": [f"recorded what built {cache_dir}"]}
    clear, clear_all, code_dir = params["clear"], params["clear_all"], params["code_dir"]
    aside = None
    done = prepare(root, cache_dir, clear, clear_all, dry_run=True)
    if code_dir:
        done += repair(code_dir, cache_dir, dry_run=True)[0]
    if done and not module.check_mode:
        with held(root, params["token"], "deploy", "compile cache"):
            done = prepare(root, cache_dir, clear, clear_all, dry_run=False)
            if code_dir:
                repaired, aside = repair(code_dir, cache_dir, dry_run=False)
                done += repaired
    result: dict = {"changed": bool(done), "done": done, "moved_aside": aside}
    if params["wanted"] is not None:
        result["warm_needed"] = bool(done) or warm_needed(cache_dir, params["wanted"])
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=True,
            cache_dir={"type": "path", "required": True},
            state={
                "type": "str",
                "choices": ["prepared", "recorded", "packed", "unpacked"],
                "default": "prepared",
            },
            clear={"type": "bool", "default": False},
            clear_all={"type": "bool", "default": False},
            wanted={"type": "dict"},
            archive={"type": "path"},
            code_dir={"type": "path"},
        ),
        required_if=[
            ("state", "recorded", ["wanted"]),
            ("state", "packed", ["archive"]),
            ("state", "unpacked", ["archive", "wanted"]),
        ],
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except (LockError, OSError, ValueError, tarfile.TarError) as err:
        module.fail_json(msg=str(err))


if __name__ == "__main__":
    main()
