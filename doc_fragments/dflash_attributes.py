# What check_mode and diff_mode mean, said once for every module (as community.general's
# attributes fragment does); each module states only its own support and, where it helps, the
# details of what it does in that mode.


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return what it would change, without changing the target.
  diff_mode:
    description: Returns what changed (or would change, in check mode) as a diff, when in diff mode.
"""
