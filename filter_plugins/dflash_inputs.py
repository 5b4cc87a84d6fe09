# Controller-side filters of the inputs, before anything changes: what run.sh will say (the GPU
# layout, trainer flags and environment, each bad value named), the release name and the env
# lock; inventory and -e variables that look like ours but that no part of the toolkit reads (a
# typo such as dflash_keep_release is otherwise silently ignored), and renamed ones.
from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

from dflash_env_lock import lock_id, lock_problems
from dflash_layout import (
    LayoutError,
    code_changing_env,
    data_flags,
    gpu_layout,
    supervise_flags,
    trainer_env,
    trainer_flags,
)
from dflash_release import release_id_problem

REPO = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"\bdflash_[a-z0-9_]+\b")
# YAML comments (a whole line, or after a space): prose may name a typo as an example.
_COMMENT = re.compile(r"(^|\s)#.*$", re.MULTILINE)
# Where every variable the toolkit reads is named: role defaults, argument specs, tasks,
# templates and playbooks.
_SOURCES = ("roles/**/*.yml", "roles/**/*.j2", "playbooks/*.yml", "inventory/*.yml")


@functools.cache
def known_names() -> frozenset[str]:
    names: set[str] = set()
    for pattern in _SOURCES:
        for path in REPO.glob(pattern):
            text = _COMMENT.sub("", path.read_text(encoding="utf-8", errors="replace"))
            names.update(_NAME.findall(text))
    return frozenset(names)


def unknown_vars(names: list[str]) -> list[str]:
    """One sentence per `dflash_*` name that no part of the toolkit reads, naming the closest
    known one; [] when every name is known."""
    known = known_names()
    out = []
    for name in sorted(set(names) - known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else "no dflash role reads it"
        out.append(f"{name} is set but unknown to dflash-deploy ({hint})")
    return out


# Old name -> new name of the variables renamed for one name per concept (issue 27). The
# old names still work for one release (roles/dflash/defaults/main.yml maps them), then go.
RENAMED = {
    "dflash_lock": "dflash_env_lock",
    "dflash_lock_wait": "dflash_deploy_lock_wait",
    "dflash_lock_stale_after": "dflash_deploy_lock_stale_after",
    "dflash_lock_break": "dflash_deploy_lock_break",
}


def renamed_vars(names: list[str]) -> list[str]:
    """One warning per old name that is set, naming its new name."""
    return [
        f"{old} is renamed {RENAMED[old]}: the old name still works in this release and is "
        f"gone in the next; rename it where you set it (an inventory, -e)"
        + (f". {RENAMED[old]} is set too, and wins" if RENAMED[old] in names else "")
        for old in sorted(set(names) & RENAMED.keys())
    ]


def dflash_run_spec(data: dict) -> dict:
    """What run.sh will say, validated: GPU layout, trainer flags (one [flag, value?] group
    per line of run.sh) and environment; `problems` lists every bad input, each naming the
    value and the fix, `warnings` what is allowed but changes what runs."""
    spec: dict = {"problems": [], "warnings": []}
    checks = {
        # The trainer's --cpu-ranks (tests) lays the GPU ranks out on the CPU: no GPU needed.
        "layout": lambda: gpu_layout(
            data.get("target_gpus"), data.get("drafter_gpus"), bool(data.get("colocated")),
            None if (data.get("args") or {}).get("cpu_ranks") else data.get("visible"),
        ),
        "flags": lambda: trainer_flags(data.get("args") or {}) + data_flags(data.get("data")),
        "env": lambda: trainer_env(data.get("env") or {}),
        "supervise": lambda: supervise_flags(
            data.get("restart_policy", {}), data.get("hang_after", "auto")
        ),
    }  # fmt: skip
    for key, check in checks.items():
        try:
            spec[key] = check()
        except LayoutError as err:
            spec["problems"].append(str(err))
    # Listed in dflash_trainer_env_allow: meant. Else a warning, or with dflash_strict_vars a
    # problem like any other bad input.
    code_changing = code_changing_env(spec.get("env") or {}, list(data.get("env_allow") or []))
    spec["problems" if data.get("strict") else "warnings"] += code_changing
    return spec


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_unknown_vars": unknown_vars,
            "dflash_renamed_vars": renamed_vars,
            "dflash_run_spec": dflash_run_spec,
            "dflash_release_problem": release_id_problem,
            "dflash_env_lock_problems": lock_problems,
            "dflash_lock_id": lock_id,
        }
