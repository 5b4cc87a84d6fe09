# Controller-side filters of the compile cache step: the identity a build's cache is only ever
# used by, and the folder it names. The rules are module_utils/dflash_compile_cache.py's, which
# the target's modules run too.
from __future__ import annotations

from dflash_compile_cache import folder, identity


def cache_identity(lock: dict | None, gpus: list[dict], code: dict) -> dict:
    """The identity for the env lock, the target's GPUs as preflight read them (the first one's
    name and driver; none: the CPU) and the release's code key (its build result's
    `cache_code`)."""
    return identity(lock, gpus[0] if gpus else None, code)


def cache_folder(built_by: dict, root: str) -> str:
    return folder(root, built_by)


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_compile_cache_identity": cache_identity,
            "dflash_compile_cache_folder": cache_folder,
        }
