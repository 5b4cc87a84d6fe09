# The trainer's launch data (inventory): GPU roles, trainer flags and environment variables,
# validated before anything is rendered, so that run.sh can only say what the data says.
from __future__ import annotations

import re

_FLAG_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the toolkit itself in run.sh; inventory data may not override them. They are the
# trainer's launcher flags (dflash/flags.py LAUNCHER, which tests/unit/test_history_shape.py
# holds this to): refused here, before the release's own description of its flags is read.
RESERVED_FLAGS = {"target_gpus", "drafter_gpus", "checkpoint_dir", "status_file", "run_id"}
# Named by their own inventory variable, which preflight checks on the target.
DATA_FLAGS = {
    "data": "dflash_data",
    "data_cache": "dflash_data (its JSONL cache is <root>/data-cache)",
}
RESERVED_ENV_PREFIXES = ("DFLASH_",)
RESERVED_ENV = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONDONTWRITEBYTECODE",
                "PYTHONUNBUFFERED"}  # fmt: skip
# They change what code runs beside the release and its env, which verify cannot see: preflight
# warns (refuses with dflash_strict_vars) unless dflash_trainer_env_allow lists the name.
CODE_CHANGING_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME")


class RunSpecError(ValueError):
    pass


def flag_name(key: object) -> str:
    """A dflash_trainer_args key as the trainer's command line spells it: `checkpoint_every`
    is `--checkpoint-every`."""
    return "--" + str(key).replace("_", "-")


def parse_gpus(value: object, name: str) -> list[int]:
    """[0, 1, 2] from a list of ints, '0-2', '0,1,2', '0-1,2'; [] from None or ''."""
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        items: list[object] = [value]
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list):
        items = value
    else:
        raise RunSpecError(
            f"{name} {value!r} is not a GPU list; use a list like [5, 6, 7] or '5-7'"
        )
    gpus: list[int] = []
    for item in items:
        text = str(item).strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
        if isinstance(item, bool) or not match:
            raise RunSpecError(
                f"{name} '{value}': '{text}' is not a GPU index or range; "
                "use a list like [5, 6, 7] or a range like '5-7'"
            )
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise RunSpecError(
                f"{name} '{value}': range '{text}' runs backwards; write '{high}-{low}'"
            )
        gpus.extend(range(low, high + 1))
    duplicates = sorted({g for g in gpus if gpus.count(g) > 1})
    if duplicates:
        raise RunSpecError(f"{name} '{value}' names GPU {duplicates} more than once")
    return gpus


def gpu_layout(
    target: object, drafter: object, colocated: bool = False, visible: list[int] | None = None
) -> dict:
    """The validated GPU roles: {target, drafter, mode}; a RunSpecError names what is wrong."""
    target_gpus = parse_gpus(target, "dflash_target_gpus")
    drafter_gpus = parse_gpus(drafter, "dflash_drafter_gpus")
    if not target_gpus and not drafter_gpus:
        return {"target": [], "drafter": [], "mode": "cpu"}
    if not target_gpus or not drafter_gpus:
        raise RunSpecError(
            f"dflash_target_gpus {target_gpus} and dflash_drafter_gpus {drafter_gpus}: give both "
            "(equal lists with dflash_colocated: true, or disjoint lists), or neither for CPU mode"
        )
    overlap = sorted(set(target_gpus) & set(drafter_gpus))
    if colocated and sorted(target_gpus) != sorted(drafter_gpus):
        raise RunSpecError(
            f"dflash_colocated is true but dflash_target_gpus {target_gpus} and "
            f"dflash_drafter_gpus {drafter_gpus} differ; colocated mode runs both on the same GPUs"
        )
    if not colocated and overlap:
        raise RunSpecError(
            f"GPU {overlap} is in both dflash_target_gpus {target_gpus} and dflash_drafter_gpus "
            f"{drafter_gpus}; make them disjoint, or set dflash_colocated: true with equal lists"
        )
    if visible is not None:
        missing = sorted(set(target_gpus + drafter_gpus) - set(visible))
        if missing:
            raise RunSpecError(
                f"GPU {missing} is not visible in the container (nvidia-smi lists "
                f"{sorted(visible) or 'no GPU'}); pass it through in the container config or "
                "change dflash_target_gpus / dflash_drafter_gpus"
            )
    return {
        "target": target_gpus,
        "drafter": drafter_gpus,
        "mode": "colocated" if colocated else "split",
    }


def trainer_flags(args: object) -> list[list[str]]:
    """[flag, value] groups from the trainer-args mapping; True is a bare flag, False/None none."""
    if not isinstance(args, dict):
        raise RunSpecError(f"dflash_trainer_args must be a mapping of flag: value, got {args!r}")
    groups: list[list[str]] = []
    for key, value in args.items():
        if not _FLAG_RE.match(str(key)):
            raise RunSpecError(
                f"dflash_trainer_args key '{key}' is not a flag name; write it like token_budget"
            )
        if key in RESERVED_FLAGS:
            raise RunSpecError(
                f"dflash_trainer_args sets '{key}', which the toolkit sets itself; use "
                "dflash_target_gpus / dflash_drafter_gpus, or leave it out"
            )
        if key in DATA_FLAGS:
            raise RunSpecError(
                f"dflash_trainer_args sets '{key}'; name the training data with "
                f"{DATA_FLAGS[key]}: a store folder or JSONL file on the target, or self_generated"
            )
        flag = flag_name(key)
        if value is True:
            groups.append([flag])
        elif value is False or value is None:
            continue
        elif isinstance(value, (dict, list)):
            raise RunSpecError(f"dflash_trainer_args.{key} {value!r} must be a single value")
        else:
            groups.append([flag, checked_value(str(value), f"dflash_trainer_args.{key}")])
    return groups


def data_flags(data: object) -> list[list[str]]:
    """run.sh's --data group for dflash_data: none for self_generated, else the path."""
    if data in (None, "", "self_generated"):
        return []
    if not isinstance(data, str) or not data.startswith("/") or "\n" in data:
        raise RunSpecError(
            f"dflash_data {data!r} must be self_generated or an absolute path on the target (a "
            "store folder made by python -m dflash.data prepare, or a JSONL file)"
        )
    return [["--data", checked_value(data, "dflash_data")]]


def trainer_env(env: object) -> dict[str, str]:
    if not isinstance(env, dict):
        raise RunSpecError(f"dflash_trainer_env must be a mapping of NAME: value, got {env!r}")
    out = {}
    for name, value in env.items():
        if not _ENV_RE.match(str(name)):
            raise RunSpecError(
                f"dflash_trainer_env name '{name}' is not an environment variable name"
            )
        if name in RESERVED_ENV or str(name).startswith(RESERVED_ENV_PREFIXES):
            raise RunSpecError(
                f"dflash_trainer_env sets {name}, which run.sh sets itself; leave it out"
            )
        out[str(name)] = checked_value(
            "" if value is None else str(value), f"dflash_trainer_env.{name}"
        )
    return out


def checked_value(value: str, name: str) -> str:
    # Quoting makes every other character safe; a NUL cannot be passed through exec at all.
    if "\0" in value:
        raise RunSpecError(f"{name} contains a NUL byte, which no argument or variable can hold")
    return value


def code_changing_env(env: dict[str, str], allowed: list[str]) -> list[str]:
    """A message for each trainer variable that makes other code run than the deployed one,
    unless dflash_trainer_env_allow names it."""
    return [
        f"dflash_trainer_env sets {name}={env[name]!r}: the trainer then loads code from outside "
        "its release and env, which verify does not check; leave it out, or list it in "
        f"dflash_trainer_env_allow: [{name}] if you mean it"
        for name in CODE_CHANGING_ENV
        if name in env and name not in allowed
    ]


def supervise_flags(policy: object, hang_after: object) -> list[list[str]]:
    """run.sh's flags of python -m dflash.supervise: one per key of dflash_restart_policy
    (max_restarts -> --max-restarts; `enabled: false` -> --max-restarts 0) and dflash_hang_after.
    The keys, bounds and defaults are the supervisor's own (dflash/flags.py supervise_parser):
    preflight checks these flags with the release being deployed (supervise_problems below
    names what it refuses), and a key left out keeps the supervisor's default."""
    if not isinstance(policy, dict):
        raise RunSpecError(
            f"dflash_restart_policy {policy!r} must be a mapping of policy: value "
            "(e.g. {max_restarts: 5, window: 3600})"
        )
    enabled = policy.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RunSpecError(f"dflash_restart_policy.enabled {enabled!r}: true or false")
    flags = [["--max-restarts", "0"]] if not enabled else []
    # In the keys' order, not the inventory's: run.sh's text must not change with it.
    for key, value in sorted(policy.items(), key=lambda item: str(item[0])):
        if key == "enabled" or (key == "max_restarts" and not enabled):
            continue
        said = str(value).lower() if isinstance(value, bool) else str(value)
        flags.append([flag_name(key), said])
    return [*flags, ["--hang-after", str(hang_after)]]


def _variable(flag: str) -> str:
    """The variable that makes a supervise flag of run.sh."""
    key = flag[2:].replace("-", "_")
    return "dflash_hang_after" if key == "hang_after" else f"dflash_restart_policy.{key}"


def supervise_problems(problems: list[str], policy: dict, hang_after: object) -> list[str]:
    """The release's refusals of run.sh's supervise flags (python -m dflash.flags check
    supervise), told by the variables that made the flags: `argument --backoff: '0' must be
    > 0.0` is `dflash_restart_policy.backoff 0: '0' must be > 0.0`."""
    given = {flag_name(key): value for key, value in policy.items()}
    given["--hang-after"] = hang_after
    told = []
    for problem in problems:
        said = re.match(r"(?:argument|unknown flag) (--[a-z][a-z-]*)(?::\s*|\s+|$)", problem)
        if said:
            flag = said.group(1)
            value = f" {given[flag]!r}" if flag in given else ""
            rest = problem[said.end() :]
            if problem.startswith("unknown"):
                rest = f"no such key in this release's restart policy {rest}".rstrip()
            problem = f"{_variable(flag)}{value}: {rest}"
        told.append(re.sub(r"--[a-z][a-z-]*", lambda m: _variable(m.group(0)), problem))
    return told
