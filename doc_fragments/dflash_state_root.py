# The state root option, the same in every module that works under it. A module whose root
# needs more words (dflash_deploy_lock, dflash_warmup) documents it itself and leaves this
# fragment out: ansible-doc lets a module's option replace a fragment's whole, not add to it.


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  root:
    description: State root on the target.
    type: path
    required: true
"""
