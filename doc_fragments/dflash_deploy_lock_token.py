# The deploy lock's token of a run (M(dflash_deploy_lock)), which a module proves it still holds
# before each change (module_utils/dflash_lockfile.py, fence). DOCUMENTATION is for a module
# that only checks it; TAKES_THE_LOCK (extends_documentation_fragment:
# dflash_deploy_lock_token.takes_the_lock) for one that, without a token, takes the lock for its
# own change.


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  token:
    description: The deploy lock's token of this run (M(dflash_deploy_lock)).
    type: str
"""

    TAKES_THE_LOCK = r"""
options:
  token:
    description: The deploy lock's token of this run (M(dflash_deploy_lock)); without it the
      module takes the lock for its own change.
    type: str
"""
