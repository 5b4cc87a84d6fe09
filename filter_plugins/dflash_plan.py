# Controller-side filters of deploy.yml's decisions, from preflight's one read of the target:
# why the deploy's steps run (an empty list: a no-op deploy, which skips them) and what it
# changes in place (the snapshot step's reason to take one), and whether the running deployment
# came from another controller. The rules are module_utils/dflash_plan.py's, which the launch
# module asks too, and module_utils/dflash_controller.py's.
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_controller import (
    other_controller,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import deploy_need
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_plan import (
    deploy_changes,
    deploy_work,
)


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_deploy_work": deploy_work,
            "dflash_deploy_changes": deploy_changes,
            "dflash_deploy_disk_need": deploy_need,
            "dflash_other_controller": other_controller,
        }
