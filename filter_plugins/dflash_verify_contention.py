# Controller-side filter of verify.yml for a busy host: the `contention` finding, from the
# trainer's own windows and dflash_facts' sample of who takes the CPU
# (module_utils/dflash_contention.py judges both).
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_contention import (
    contention_findings,
)


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_contention_findings": contention_findings}
