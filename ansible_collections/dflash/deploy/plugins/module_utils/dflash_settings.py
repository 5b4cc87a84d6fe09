# What changes between two deployments in the terms a user sets them: trainer flags
# (dflash_trainer_args), the trainer's environment, torchrun's arguments, the GPUs and the data.
# A deploy's reasons say this instead of "run.sh differs"; a rollback names what it puts back.
# Standard library only: the target's modules and the controller's filters use it alike.
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import SELF_GENERATED
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_run_spec import flag_name


def _mapping(what: str, old: dict | None, new: dict | None, name=str) -> list[str]:
    """`what --x 20 added`, `what --x 20 removed`, `what --x: 20 -> 40`, by name."""
    old, new = old or {}, new or {}
    lines = []
    for key in sorted(set(old) | set(new), key=str):
        if key not in old:
            lines.append(f"{what} {name(key)} {new[key]} added")
        elif key not in new:
            lines.append(f"{what} {name(key)} {old[key]} removed")
        elif str(old[key]) != str(new[key]):  # 20 from the inventory, "20" from -e
            lines.append(f"{what} {name(key)}: {old[key]} -> {new[key]}")
    return lines


def gpus_text(layout: dict | None) -> str:
    """`target 0 drafter 1`, or the mode where no GPU is named (`cpu`)."""
    layout = layout or {}
    roles = [
        f"{role} {','.join(map(str, layout[role]))}"
        for role in ("target", "drafter")
        if layout.get(role)
    ]
    return " ".join(roles) or str(layout.get("mode") or "none")


def data_text(data: dict | None) -> str:
    """`/srv/store (store 4d9d71f7a8a2)`, `/srv/x.jsonl (jsonl)` or `self-generated`."""
    data = data or {}
    kind = data.get("kind") or SELF_GENERATED
    if kind == SELF_GENERATED:
        return "self-generated"
    sha = str(data.get("content_sha256") or "")[:12]
    return f"{data.get('path')} ({kind}{' ' + sha if sha else ''})"


def _same_data(old: dict | None, new: dict | None) -> bool:
    """The same path and kind, and the same content where both know it (a JSONL file's
    read before a trainer hashes it has no content hash yet)."""
    old, new = old or {}, new or {}
    if (old.get("kind") or SELF_GENERATED) != (new.get("kind") or SELF_GENERATED):
        return False
    if old.get("path") != new.get("path"):
        return False
    before, after = old.get("content_sha256"), new.get("content_sha256")
    return not (before and after and before != after)


def setting_changes(before: dict | None, after: dict | None) -> list[str]:
    """One line per setting that differs from deployment `before` to `after`, each a history
    line's shape (`run_sh`: layout, trainer_args, trainer_env, torchrun_args; `data`)."""
    before, after = before or {}, after or {}
    old, new = before.get("run_sh") or {}, after.get("run_sh") or {}
    lines = _mapping("trainer flag", old.get("trainer_args"), new.get("trainer_args"), flag_name)
    lines += _mapping("trainer env", old.get("trainer_env"), new.get("trainer_env"))
    if (old.get("torchrun_args") or []) != (new.get("torchrun_args") or []):
        lines.append(
            f"torchrun args: {' '.join(map(str, old.get('torchrun_args') or [])) or 'none'} -> "
            f"{' '.join(map(str, new.get('torchrun_args') or [])) or 'none'}"
        )
    if gpus_text(old.get("layout")) != gpus_text(new.get("layout")):
        lines.append(f"GPUs: {gpus_text(old.get('layout'))} -> {gpus_text(new.get('layout'))}")
    if not _same_data(before.get("data"), after.get("data")):
        lines.append(f"data: {data_text(before.get('data'))} -> {data_text(after.get('data'))}")
    return lines


def settings_text(entry: dict | None) -> str:
    """A deployment's settings in one line: data, GPUs and trainer flags."""
    entry = entry or {}
    run_sh = entry.get("run_sh") or {}
    args = run_sh.get("trainer_args") or {}
    flags = " ".join(
        f"{flag_name(k)} {v}" for k, v in sorted(args.items(), key=lambda kv: str(kv[0]))
    )
    return (
        f"data {data_text(entry.get('data'))}, GPUs {gpus_text(run_sh.get('layout'))}, "
        f"flags {flags or 'none'}"
    )
