# The options every module under the state root shares, built once (as community.proxmox builds
# its login options in one function): `root`, documented by doc_fragments/dflash_state_root.py,
# and for a module that changes the state under the deploy lock, the holder's `token`
# (doc_fragments/dflash_deploy_lock_token.py; not a secret: it fences a run whose lock was
# taken over). Standard library only.
from __future__ import annotations


def state_root_args(*, takes_the_lock: bool, **options: dict) -> dict:
    """An argument_spec: the shared options, then the module's own."""
    spec: dict = {"root": {"type": "path", "required": True}}
    if takes_the_lock:
        spec["token"] = {"type": "str", "no_log": False}
    return {**spec, **options}
