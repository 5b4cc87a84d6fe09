#!/usr/bin/python
# The figures of a target's report page (history.yml -e dflash_history_html=true); reads only.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_report
short_description: The deployments of a target with their runs' figures and drops, for a report
description:
  - Read-only. Returns every line of C(history.jsonl) as C(dflash_history) lists it, with the
    stage times and step spread its health check recorded and, from the deployment's run folder,
    the goodput and restarts (C(supervisor.json)), the compile cache it started on
    (C(status.json)) and its tokens/s over the steps (the step lines of C(train.log)).
  - For every healthy deployment under I(min_ratio) of the newest healthy deployment of the
    same layout, shape and data before it, what changed from that one and from the fastest such
    deployment before it (files with text diffs, environment pins, run.sh values, GPU layout,
    data), as C(dflash_history) compares two deployments.
  - The controller draws the page (the C(dflash_report_html) filter) and keeps the drops under
    verify's noise band.
extends_documentation_fragment:
  - dflash_attributes
  - dflash_state_root
options:
  min_ratio:
    description:
      - The share of the reference's tokens/s under which a deployment is a drop candidate;
        verify's C(dflash_verify_min_throughput_ratio).
    type: float
    default: 0.8
  series_points:
    description: At most this many points of each run's steps (a sample of a long run).
    type: int
    default: 120
attributes:
  check_mode:
    support: full
    details: Reads only; runs the same in check mode.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: The figures of the report
  dflash_report:
    root: /opt/dflash
    min_ratio: 0.8
"""

RETURN = r"""
deployments:
  description:
    - The lines of history.jsonl, oldest first, numbered from 1, as dflash_history lists them,
      with C(stages), C(step_spread), C(rolled_back_to), C(run_id), C(goodput), C(restarts),
      C(compile_cache) (C(fingerprint), C(started_warm), C(first_step_s)) and C(series)
      (C(time), C(step), C(tokens_per_s) of the run's logged steps).
  type: list
  elements: dict
  returned: always
drops:
  description:
    - Each drop candidate - C(number), its C(reference) (a number), C(ratio),
      C(reference_step_spread), C(previous) (what changed from the reference) and C(fastest)
      (from the fastest comparable deployment before it; null when that is the reference).
    - Each side as diff.yml returns it (C(from), C(to), C(files), C(changes), C(throughput),
      C(restarts)) with C(run_sh_text), the unified diff of the two run.sh texts.
  type: list
  elements: dict
  returned: always
current:
  description: The release C(current) points at.
  type: str
  returned: always
damaged:
  description: The lines of history.jsonl that are not a JSON record (line from 1, bytes, text).
  type: list
  elements: dict
  returned: always
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_module_args import (
    state_root_args,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_report import (
    report_data,
    step_series,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    STATUS,
    SUPERVISOR,
    TRAIN_LOG,
    current_release,
    read_history_checked,
    read_json,
    release_file_reader,
    release_manifests,
    run_path,
)


def run_folder(root: str, run_id: str, points: int) -> dict:
    """What a run's folder says; a folder removed by hand, or a log never written, says less."""
    try:
        with open(run_path(root, run_id, TRAIN_LOG), encoding="utf-8", errors="replace") as log:
            series = step_series(log, points)
    except OSError:
        series = []
    return {
        "supervisor": read_json(run_path(root, run_id, SUPERVISOR)),
        "status": read_json(run_path(root, run_id, STATUS)),
        "series": series,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec=state_root_args(
            takes_the_lock=False,
            min_ratio={"type": "float", "default": 0.8},
            series_points={"type": "int", "default": 120},
        ),
        supports_check_mode=True,
    )
    root = module.params["root"]
    history, damaged = read_history_checked(root)
    runs = {
        run_id: run_folder(root, run_id, module.params["series_points"])
        for run_id in {entry.get("run_id") for entry in history}
        if isinstance(run_id, str) and run_id
    }
    data = report_data(
        history,
        release_manifests(root),
        release_file_reader(root),
        runs,
        module.params["min_ratio"],
    )
    current, _link = current_release(root)
    module.exit_json(changed=False, current=current, damaged=damaged, **data)


if __name__ == "__main__":
    main()
