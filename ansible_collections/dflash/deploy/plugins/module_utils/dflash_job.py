# Which hosts make a job (dflash_job): shared by the deploy's plan and verify's job verdict.
from __future__ import annotations

from typing import Any


def job_members(hostvars: Any, name: str, inventory_hosts: list[str]) -> list[str]:
    """The inventory's hosts whose dflash_job is `name`, in inventory order."""
    return [h for h in inventory_hosts if str(hostvars[h].get("dflash_job") or "") == name]
