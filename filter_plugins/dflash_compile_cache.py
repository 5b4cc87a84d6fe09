# Controller-side filters of the compile cache step: the identity a build's cache is only ever
# used by, and the folder it names. The rules are module_utils/dflash_compile_cache.py's, which
# the target's modules run too.
from __future__ import annotations

import hashlib
import json

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_compile_cache import (
    fingerprint,
    folder,
    identity,
    identity_of,
)


def cache_identity(lock: dict | None, gpus: list[dict], code: dict) -> dict:
    """The identity for the env lock, the target's GPUs as preflight read them (the first one's
    name and driver; none: the CPU) and the release's code key (its build result's
    `cache_code`)."""
    return identity(lock, gpus[0] if gpus else None, code)


def cache_folder(built_by: dict, root: str) -> str:
    return folder(root, built_by)


def artifact_name(wanted: dict) -> str:
    """The controller's file of a warmed cache: its folder's fingerprint and a hash of all it
    was built by (the warmup's flags and environment included): only an exact match is taken."""
    exact = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]
    return f"{fingerprint(identity_of(wanted))}-{exact}.tar.gz"


def first_host_with(hosts: list[str], hostvars: dict, name: str, value: str) -> str:
    """The first of `hosts` (play order) whose variable `name` equals `value`; '' for none.
    Hosts that did not set it (no work this run) never match."""
    for host in hosts:
        if value and hostvars[host].get(name) == value:
            return host
    return ""


def cache_record(
    mode: str,
    cache_dir: str,
    warmup: dict | None,
    received: dict | None,
    warmed: bool,
    prepared: dict | None = None,
) -> dict:
    """history.jsonl's `compile_cache` of a deployment: its folder, what this deploy did with it
    (`compiled` here, `received` the controller's copy, `warm` already, or the keep/clear
    asked for), and where files that differ from their recorded hashes were moved (prepare)
    and a cache that failed its canary during the warmup was moved."""
    if warmed:
        did = "compiled"
    elif (received or {}).get("changed"):
        did = "received"
    elif mode == "warm":
        did = "warm"
    else:
        did = {"keep": "kept", "clear": "cleared"}.get(mode, mode)
    moved = [(prepared or {}).get("moved_aside")]
    moved += [r.get("moved_aside") for r in (warmup or {}).get("results", [])]
    moved = [folder for folder in moved if folder]
    return {"dir": cache_dir, "did": did, "moved_aside": moved}


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_compile_cache_identity": cache_identity,
            "dflash_compile_cache_folder": cache_folder,
            "dflash_compile_cache_artifact": artifact_name,
            "dflash_first_host_with": first_host_with,
            "dflash_compile_cache_record": cache_record,
        }
