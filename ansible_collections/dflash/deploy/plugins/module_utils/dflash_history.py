# The deployments of one target as history.jsonl records them: a listing, the choice of two
# of them by a selector, and what changed between them (files, environment, run.sh values,
# GPU layout, throughput). Pure functions over the history and the release manifests, for
# modules and filters alike (which of them compare by tokens/s: dflash_throughput).
from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_data import diff_fields
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import hashes, pinned
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import records_code
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import GOOD_RESULTS as GOOD
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import deployment_index
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    fastest_comparable,
    fastest_of,
    measured_apart,
    rated,
    reference_speed,
    shape_of,
)

SELECTORS = "current, previous, fastest, last, a number from history.yml, or a release id"
TEXT_DIFF_LINES = 200


class SelectorError(ValueError):
    pass


def listing(history: list[dict]) -> list[dict]:
    """One row per deployment, numbered from 1 (oldest), without the bulky run.sh text."""
    rows = []
    for number, entry in enumerate(history, start=1):
        run_sh = entry.get("run_sh") or {}
        rows.append(
            {
                "number": number,
                "time": entry.get("time"),
                "action": entry.get("action"),
                "release": entry.get("release"),
                "tree_sha256": entry.get("tree_sha256"),
                "lock_id": entry.get("lock_id"),
                "layout": run_sh.get("layout"),
                "trainer_args": run_sh.get("trainer_args"),
                "result": entry.get("result"),
                # The health check's one figure (a busy host's wait for a CPU left out), and
                # the figure as measured where that differs.
                "tokens_per_s": reference_speed(entry),
                "measured_tokens_per_s": measured_apart(entry),
                "data": _data_name(entry.get("data")),
                "error": entry.get("error"),
                "export": entry.get("export"),
                # The supervisor's restart lines: why, and what the crash cost.
                "reason": entry.get("reason"),
                # An interrupted deploy or rollback: the phase it reached.
                "phase": entry.get("phase"),
                # A deploy that repaired a deployment history already had: what it repaired.
                "repaired": entry.get("repaired"),
                "steps_lost": entry.get("steps_lost"),
                "time_to_first_step_s": entry.get("time_to_first_step_s"),
            }
        )
    return rows


def _data_name(data: dict | None) -> str | None:
    """A deployment's data in a word: its content hash, else its kind."""
    data = data or {}
    return data.get("content_sha256") or data.get("kind")


def _newest(history: list[dict], accept: Callable[[dict], bool]) -> int | None:
    for index in range(len(history) - 1, -1, -1):
        if accept(history[index]):
            return index
    return None


def select(history: list[dict], current: str | None, selector: str) -> int:
    """Index into history of the deployment a selector names; SelectorError names the fix."""
    text = str(selector).strip()
    now = deployment_index(history, current)
    if text == "current":
        index = now
    elif text == "previous":
        # The newest good deployment before the current one that ran something else.
        before = len(history) if now is None else now
        same = _identity(history[now]) if now is not None else None
        index = _newest(
            history[:before], lambda e: e.get("result") in GOOD and _identity(e) != same
        )
    elif text == "last":
        index = _newest(history, _deployment)
    elif text == "fastest":
        # Of current's layout, shape and data (other tokens/s do not compare); of all without one.
        if now is not None and shape_of(history[now]) is not None:
            index = fastest_comparable(history, history[now])
        else:
            index = fastest_of(history, [i for i, e in enumerate(history) if rated(e)])
    elif text.isdigit():
        index = int(text) - 1 if 1 <= int(text) <= len(history) else None
        if index is not None and not _deployment(history[index]):
            raise SelectorError(
                f"#{text} of history.jsonl is the {history[index].get('action')} line, not a "
                f"deployment; use {SELECTORS}"
            )
    else:
        index = _newest(history, lambda e: _deployment(e) and e.get("release") == text)
    if index is None:
        raise SelectorError(
            f"no deployment matches '{selector}' in the {len(history)} entries of history.jsonl; "
            f"use {SELECTORS}"
        )
    return index


def _deployment(entry: dict) -> bool:
    """A deploy or rollback line; an export line records a drafter leaving and a restart line
    the supervisor starting the same deployment again, not code arriving."""
    return records_code(entry)


def _identity(entry: dict) -> tuple:
    code = tuple(entry.get(k) for k in ("tree_sha256", "lock_id", "run_sh_sha256"))
    return (*code, _data_name(entry.get("data")))


def _flatten(value: object, prefix: str) -> dict[str, object]:
    if isinstance(value, dict):
        flat: dict[str, object] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def _changes(section: str, old: dict, new: dict) -> list[dict]:
    return [
        {"section": section, "name": name, "from": old.get(name), "to": new.get(name)}
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]


WHEEL_FILES = "wheel files (sha256)"


def environment_of(entry: dict) -> dict[str, object]:
    lock = entry.get("lock") or {}
    versions: dict[str, object] = dict(pinned(lock))
    versions.update({key: lock.get(key) for key in ("python", "cuda") if key in lock})
    if lock.get("sha256"):
        # A lock made again with the same versions may name other files (a wheel rebuilt and
        # uploaded again, another platform's): one short digest of every hash shows it.
        canonical = json.dumps(hashes(lock), sort_keys=True).encode()
        versions[WHEEL_FILES] = hashlib.sha256(canonical).hexdigest()[:12]
    return versions


def environment_changes(old: dict, new: dict) -> list[dict]:
    """The pins that changed; the wheel files' digest only where no pin did (other versions
    are other files: the versions say it)."""
    changes = _changes("environment", old, new)
    pins = [change for change in changes if change["name"] != WHEEL_FILES]
    return pins or changes


# Keys of a recorded shape that are the GPU layout's (a section of their own), not flags.
_LAYOUT_KEYS = ("mode", "target_gpus", "drafter_gpus", "nnodes")


def run_sh_values(entry: dict) -> dict[str, object]:
    """run.sh values apart from the GPU layout (that one is a section of its own). A workload
    flag left to its default counts as that default where the line recorded its shape (which
    the release's own flags filled in): `target_model` unset and `tiny` are no change."""
    run_sh = {k: v for k, v in (entry.get("run_sh") or {}).items() if k != "layout"}
    shape = entry.get("shape") or {}
    args = dict(run_sh.get("trainer_args") or {})
    for name, value in shape.items():
        if name not in _LAYOUT_KEYS and args.get(name) in (None, False):
            args[name] = value
    if args:
        run_sh["trainer_args"] = args
    return _flatten(run_sh, "")


def text_diff(name: str, old: bytes, new: bytes) -> str | None:
    try:
        old_lines = old.decode().splitlines(keepends=True)
        new_lines = new.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return None  # a binary file: the name says enough
    lines = list(difflib.unified_diff(old_lines, new_lines, f"a/{name}", f"b/{name}"))
    if len(lines) > TEXT_DIFF_LINES:
        lines = [*lines[:TEXT_DIFF_LINES], f"... {len(lines) - TEXT_DIFF_LINES} more lines\n"]
    return "".join(lines)


def file_changes(
    old: dict | None, new: dict | None, read: Callable[[str, str], bytes | None]
) -> dict:
    """Files added, removed and changed between two release manifests; the text diff of a
    changed file when `read(release, path)` still finds both copies on the target."""
    if old is None or new is None:
        return {"known": False, "added": [], "removed": [], "changed": [], "text": {}}
    before, after = old.get("files", {}), new.get("files", {})
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    texts = {}
    for path in changed:
        old_bytes, new_bytes = read(old["release"], path), read(new["release"], path)
        if old_bytes is not None and new_bytes is not None:
            diff = text_diff(path, old_bytes, new_bytes)
            if diff is not None:
                texts[path] = diff
    return {
        "known": True,
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "changed": changed,
        "text": texts,
    }


def summary(history: list[dict], index: int) -> dict:
    row = listing(history)[index]
    keys = ("number", "time", "action", "release", "result", "tokens_per_s",
            "measured_tokens_per_s")  # fmt: skip
    return {k: row[k] for k in keys}


def compare(
    history: list[dict],
    old_index: int,
    new_index: int,
    manifests: dict[str, dict],
    read: Callable[[str, str], bytes | None],
) -> dict:
    """What changed from deployment `old_index` to `new_index`."""
    old, new = history[old_index], history[new_index]

    def manifest(entry: dict) -> dict | None:
        found = manifests.get(entry.get("release") or "")
        # A release rebuilt under the same name with other code is not the one deployed then.
        if found is None or found.get("tree_sha256") != entry.get("tree_sha256"):
            return None
        return dict(found, release=entry["release"])

    old_layout = (old.get("run_sh") or {}).get("layout") or {}
    new_layout = (new.get("run_sh") or {}).get("layout") or {}
    changes = [
        *_changes("release", _release_fields(old), _release_fields(new)),
        *environment_changes(environment_of(old), environment_of(new)),
        *_changes("run_sh", run_sh_values(old), run_sh_values(new)),
        *_changes("layout", _flatten(old_layout, ""), _flatten(new_layout, "")),
        *_changes("data", diff_fields(old.get("data")), diff_fields(new.get("data"))),
    ]
    old_speed, new_speed = reference_speed(old), reference_speed(new)
    both = isinstance(old_speed, (int, float)) and isinstance(new_speed, (int, float))
    return {
        "from": summary(history, old_index),
        "to": summary(history, new_index),
        "files": file_changes(manifest(old), manifest(new), read),
        "changes": changes,
        "throughput": {
            "from": old_speed,
            "to": new_speed,
            "ratio": round(new_speed / old_speed, 3) if both and old_speed else None,
        },
        "restarts": {"from": restarts_of(history, old), "to": restarts_of(history, new)},
    }


def restarts_of(history: list[dict], deployment: dict) -> list[str]:
    """The supervisor's restarts of a deployment's run, each as `reason (result)`."""
    run_id = deployment.get("run_id")
    return [
        f"{e.get('reason')} ({e.get('result')})"
        for e in history
        if run_id and e.get("action") == "restart" and e.get("run_id") == run_id
    ]


def _release_fields(entry: dict) -> dict[str, object]:
    return {k: entry.get(k) for k in ("release", "tree_sha256", "commit", "dirty", "lock_id")}
