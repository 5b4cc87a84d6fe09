# Controller-side filters of the inputs, before anything changes: list and mapping variables of
# the wrong type, what run.sh will say (the GPU layout, trainer flags and environment, each bad
# value named), the release name and the env lock; inventory and -e variables that look like ours
# but that no part of the toolkit reads (a typo such as dflash_keep_release or dlfash_ref is
# otherwise silently ignored), and renamed ones.
from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import store_refused
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    lock_id,
    lock_problems,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import release_id_problem
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_run_spec import (
    RunSpecError,
    code_changing_env,
    data_flags,
    gpu_layout,
    supervise_flags,
    supervise_problems,
    trainer_env,
    trainer_flags,
)

REPO = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"\bdflash_[a-z0-9_]+\b")
# YAML comments (a whole line, or after a space): prose may name a typo as an example.
_COMMENT = re.compile(r"(^|\s)#.*$", re.MULTILINE)
# Where every variable the toolkit reads is named: role defaults, argument specs, tasks,
# templates and playbooks, and the options of the pct connection (dflash_pct_*).
_SOURCES = ("roles/**/*.yml", "roles/**/*.j2", "playbooks/**/*.yml", "inventory/*.yml",
            "connection_plugins/*.py")  # fmt: skip


# A filter's name where a filter plugin maps it to its function ("dflash_lock_id": env_lock_id,).
_FILTER = re.compile(r'"(dflash_[a-z0-9_]+)":\s*[a-z_]')


def _plugin_names() -> set[str]:
    """Names of modules, action plugins, roles and filters: named in tasks, never variables,
    unless a role also takes one as an input (dflash_launch)."""
    names = {path.stem for pattern in ("library/*.py", "action_plugins/*.py",
                                       "roles/*/action_plugins/*.py")
             for path in REPO.glob(pattern)}  # fmt: skip
    names |= {path.name for path in REPO.glob("roles/dflash*") if path.is_dir()}
    for path in REPO.glob("filter_plugins/*.py"):
        names.update(_FILTER.findall(path.read_text(encoding="utf-8")))
    return names


def _role_inputs() -> set[str]:
    """Every role's declared inputs: its argument spec's options and its defaults."""
    names: set[str] = set()
    for path in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(path.read_text()) or {}).get("argument_specs", {}).values():
            names.update((entry or {}).get("options") or {})
    for path in REPO.glob("roles/*/defaults/main.yml"):
        names.update(yaml.safe_load(path.read_text()) or {})
    return names


@functools.cache
def known_names() -> frozenset[str]:
    """Every dflash_* name a role, template, playbook or inventory reads, less the names of
    plugins (history.yml -e dflash_report=html sets nothing the toolkit reads)."""
    names: set[str] = set()
    for pattern in _SOURCES:
        for path in REPO.glob(pattern):
            text = _COMMENT.sub("", path.read_text(encoding="utf-8", errors="replace"))
            names.update(_NAME.findall(text))
    return frozenset((names - _plugin_names()) | _role_inputs())


# A name this close to a known one, whatever its prefix or case (dlfash_ref, flash_ref, dflashref,
# DFLASH_REF), is taken for a typo of it: Ansible's own names (ansible_host, group_names, omit)
# are far from all of ours.
NEAR_EDITS = 2


def edit_distance(a: str, b: str, limit: int) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from a to b; limit + 1 once over it."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    two_back: list[int] = []
    before = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(before[j] + 1, row[j - 1] + 1, before[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], two_back[j - 2] + 1)
        if min(row) > limit:  # no later row gets under it; most names stop after a few letters
            return limit + 1
        two_back, before = before, row
    return before[-1]


@functools.cache
def near_known(name: str) -> str | None:
    """The known name within NEAR_EDITS of a name that is not one of ours, else None; cached, as
    every host of a play asks again for the same names."""
    distances = {known: edit_distance(name, known, NEAR_EDITS) for known in known_names()}
    near = sorted((d, known) for known, d in distances.items() if d <= NEAR_EDITS)
    return near[0][1] if near else None


def unknown_vars(names: list[str], strict: bool = False) -> list[str]:
    """One sentence per variable set that no part of the toolkit reads and that looks like one of
    ours (a dflash_* name, or one near a known name), naming the closest known one; [] when
    there is none. Strict (refused): with the two ways out."""
    known = known_names()
    out = []
    for name in sorted(set(names) - known):
        if name.startswith("dflash_"):
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}?" if close else "no dflash role reads it"
        elif near := near_known(name.lower()):  # Ansible's names are case-sensitive, ours lower
            hint = f"did you mean {near}?"
        else:
            continue
        out.append(f"{name} is set but unknown to dflash-deploy ({hint})")
    if strict and out:
        out[-1] += (
            ". Nothing was changed: correct the name where it is set (-e, the inventory); a "
            "variable another tool reads is a warning instead with dflash_strict_vars: false"
        )
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


_LOCK_EXAMPLE = {"python": "3.11", "torch": "2.11.0+cu128", "wheels": {"numpy": "2.2.6"},
                 "source": {"wheelhouse": "/mnt/wheelhouse"}}  # fmt: skip
# Every list and mapping variable a user sets: what it must be, and an example of the right form.
# Ansible's argument spec checks a string as if it were a list ('a,b') or a mapping ('k=v') but
# leaves the variable a string, which then fails far from its cause (a string's letters as
# torchrun arguments, "can only concatenate list"); shape_problems refuses it first.
# tests/unit/test_input_shapes.py holds this table to the roles' specs.
SHAPES: dict[str, tuple[str, list | dict]] = {
    "dflash_protect_releases": ("a list of release names", ["v1"]),
    "dflash_env_lock": ("a mapping (docs/environment-lock.md)", _LOCK_EXAMPLE),
    "dflash_lock": ("a mapping, now named dflash_env_lock", _LOCK_EXAMPLE),
    "dflash_env_lock_find_links": ("a list of folders or URLs", ["/opt/wheels"]),
    "dflash_trainer_args": ("a mapping of flag: value", {"max_steps": 100}),
    "dflash_trainer_args_defaults": ("a mapping of flag: value", {"target_model": "tiny"}),
    "dflash_trainer_env": ("a mapping of NAME: value", {"NCCL_DEBUG": "WARN"}),
    "dflash_trainer_env_allow": ("a list of variable names", ["LD_PRELOAD"]),
    "dflash_torchrun_args": ("a list of strings", ["--nnodes", "2"]),
    "dflash_restart_policy": ("a mapping of policy: value", {"max_restarts": 5, "window": 3600}),
    "dflash_controller": ("a mapping", {"user": "ci", "host": "runner-1"}),
    "dflash_proxmox_gpus": ("a list of GPU indexes", [0, 1]),
    "dflash_proxmox_mounts": ("a list of mappings", [{"path": "/data", "source": "/tank/data"}]),
    "dflash_proxmox_snapshot": ("a mapping", {"name_prefix": "dflash-predeploy", "retain": 3}),
}
# No environment lock is a value of its own: the playbooks that need one say so.
NULLABLE = {"dflash_env_lock", "dflash_lock"}


def _described(value: object) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false: as the user wrote them
    if isinstance(value, str):
        return f"the string {str(value)!r}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, Mapping):
        return f"the mapping {dict(value)!r}"
    return f"the list {list(value)!r}"  # only a list is left


def _shape_ok(value: object, example: list | dict) -> bool:
    if isinstance(example, dict):
        return isinstance(value, Mapping)
    if not isinstance(value, list):
        return False
    if isinstance(example[0], dict):
        return all(isinstance(item, Mapping) for item in value)
    return all(isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in value)


def shape_problems(variables: Mapping[str, object]) -> list[str]:
    """One sentence per list or mapping variable of `variables` (a host's hostvars: what an
    inventory or -e sets) that holds something else, naming what it got and the right form."""
    out = []
    for name, (form, example) in SHAPES.items():
        if name not in variables:
            continue
        value = variables[name]
        if (value is None and name in NULLABLE) or _shape_ok(value, example):
            continue
        right = json.dumps({name: example})
        out.append(f"{name} must be {form}, got {_described(value)}; e.g. -e '{right}'")
    return out


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
        except RunSpecError as err:
            spec["problems"].append(str(err))
    # Listed in dflash_trainer_env_allow: meant. Else a warning, or with dflash_strict_vars a
    # problem like any other bad input.
    code_changing = code_changing_env(spec.get("env") or {}, list(data.get("env_allow") or []))
    spec["problems" if data.get("strict") else "warnings"] += code_changing
    return spec


def env_lock_id(lock: object) -> str:
    """The env folder name of a lock; "" where there is no lock (a rollback to a deployment
    whose history line recorded none compares it with preflight's read and finds no env)."""
    return lock_id(lock) if isinstance(lock, dict) else ""


def env_name(lock: object) -> str:
    """envs/<lock id> of a lock, for a task's name; a deployment that recorded no lock (an old
    or torn history line) has none, and the name must still render."""
    return env_lock_id(lock) or "(no lock recorded)"


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_shape_problems": shape_problems,
            "dflash_unknown_vars": unknown_vars,
            "dflash_renamed_vars": renamed_vars,
            "dflash_run_spec": dflash_run_spec,
            "dflash_supervise_problems": supervise_problems,
            "dflash_store_refused": store_refused,
            "dflash_release_problem": release_id_problem,
            "dflash_env_lock_problems": lock_problems,
            "dflash_lock_id": env_lock_id,
            "dflash_env_name": env_name,
        }
