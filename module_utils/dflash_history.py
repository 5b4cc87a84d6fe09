# The deployments of one target as history.jsonl records them: a listing, the choice of two
# of them by a selector, what changed between them (files, environment, run.sh values, GPU
# layout, throughput), and which of them ran the same workload (their tokens/s compare).
# Pure functions over the history and the release manifests, for modules and filters alike.
from __future__ import annotations

import difflib
from collections.abc import Callable

try:  # in a module: Ansible ships module_utils as ansible.module_utils.*
    from ansible.module_utils.dflash_lock import pinned
    from ansible.module_utils.dflash_state import GOOD_RESULTS as GOOD
    from ansible.module_utils.dflash_state import deployment_index
except ImportError:  # in a controller filter, which puts module_utils/ on sys.path
    from dflash_lock import pinned
    from dflash_state import GOOD_RESULTS as GOOD
    from dflash_state import deployment_index

SELECTORS = "current, previous, fastest, last, a number from history.yml, or a release id"
TEXT_DIFF_LINES = 200
# The trainer's defaults (dflash/options.py) of the flags that fix what one step computes;
# tests/unit/test_history_shape.py holds them against the trainer's parser.
SHAPE_DEFAULTS: dict[str, object] = {
    "target_model": "tiny",
    "max_seq_len": 3072,
    "num_anchors": 512,
    "block_size": 16,
    "drafter_layers": 5,
}
# --token-budget's default on the CPU; on a GPU it is --max-seq-len.
CPU_TOKEN_BUDGET = 512


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
                "tokens_per_s": entry.get("tokens_per_s"),
                "error": entry.get("error"),
                "export": entry.get("export"),
            }
        )
    return rows


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
        # Of current's layout and shape (other tokens/s do not compare); of all without one.
        if now is not None and shape_of(history[now]) is not None:
            index = fastest_comparable(history, history[now])
        else:
            index = _fastest(history, [i for i, e in enumerate(history) if rated(e)])
    elif text.isdigit():
        index = int(text) - 1 if 1 <= int(text) <= len(history) else None
        if index is not None and not _deployment(history[index]):
            raise SelectorError(
                f"#{text} of history.jsonl is an {history[index].get('action')}, not a "
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
    """A deploy or rollback line; an export line records a drafter leaving, not code arriving."""
    return entry.get("action") != "export"


def _identity(entry: dict) -> tuple:
    return tuple(entry.get(k) for k in ("tree_sha256", "lock_id", "run_sh_sha256"))


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


def environment_of(entry: dict) -> dict[str, object]:
    lock = entry.get("lock") or {}
    versions: dict[str, object] = dict(pinned(lock))
    versions.update({key: lock.get(key) for key in ("python", "cuda") if key in lock})
    return versions


def run_sh_values(entry: dict) -> dict[str, object]:
    """run.sh values apart from the GPU layout (that one is a section of its own)."""
    run_sh = {k: v for k, v in (entry.get("run_sh") or {}).items() if k != "layout"}
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
    return {k: row[k] for k in ("number", "time", "action", "release", "result", "tokens_per_s")}


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
        *_changes("environment", environment_of(old), environment_of(new)),
        *_changes("run_sh", run_sh_values(old), run_sh_values(new)),
        *_changes("layout", _flatten(old_layout, ""), _flatten(new_layout, "")),
    ]
    old_speed, new_speed = old.get("tokens_per_s"), new.get("tokens_per_s")
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
    }


def _release_fields(entry: dict) -> dict[str, object]:
    return {k: entry.get(k) for k in ("release", "tree_sha256", "commit", "dirty", "lock_id")}


def _flag_value(value: object) -> object:
    """An inventory value as the trainer parses it: '4096' and 4096 are the same flag."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value).strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.rstrip("/") or text  # a model folder named with or without its last slash


def _nnodes(torchrun_args: list) -> str:
    """torchrun's --nnodes (1, 2, or an elastic 1:4) from run.sh's torchrun arguments."""
    args = [str(a) for a in torchrun_args]
    for position, arg in enumerate(args):
        if arg.startswith("--nnodes="):
            return arg.split("=", 1)[1]
        if arg == "--nnodes" and position + 1 < len(args):
            return args[position + 1]
    return "1"


def shape_of(entry: dict) -> dict | None:
    """What one training step of a deployment computes, and where: GPU mode and lists, nodes,
    target model, tokens per step, sequence length, block size, anchors and drafter depth,
    from its recorded run.sh values, with the trainer's defaults for the flags left out.
    Two deployments of the same shape should train at the same tokens/s; anything else that
    differs (code, env, other flags) is what diff.yml shows. None without run.sh values."""
    run_sh = entry.get("run_sh") or {}
    layout = run_sh.get("layout")
    if not layout:
        return None
    args = {str(key): _flag_value(value) for key, value in
            (run_sh.get("trainer_args") or {}).items() if value not in (None, False)}  # fmt: skip
    shape = {key: args.get(key, default) for key, default in SHAPE_DEFAULTS.items()}
    on_gpu = layout.get("mode") != "cpu"
    shape["token_budget"] = args.get("token_budget") or (
        shape["max_seq_len"] if on_gpu else CPU_TOKEN_BUDGET
    )
    shape.update(
        mode=layout.get("mode"),
        target_gpus=sorted(layout.get("target") or []),
        drafter_gpus=sorted(layout.get("drafter") or []),
        nnodes=_nnodes(run_sh.get("torchrun_args") or []),
    )
    return shape


def rated(entry: dict) -> bool:
    """A healthy deployment with the tokens/s its health check measured."""
    speed = entry.get("tokens_per_s")
    return (
        entry.get("result") == "healthy"
        and isinstance(speed, (int, float))
        and not isinstance(speed, bool)
        and speed > 0
    )


def comparable_indexes(history: list[dict], entry: dict) -> list[int]:
    """Indexes (oldest first) of the healthy deployments with a tokens/s figure whose shape is
    `entry`'s; `entry` itself among them when it is such a line of `history`."""
    shape = shape_of(entry)
    if shape is None:
        return []
    return [i for i, other in enumerate(history) if rated(other) and shape_of(other) == shape]


def comparable(history: list[dict], entry: dict) -> list[dict]:
    """The healthy deployments whose tokens/s compare with `entry`'s (comparable_indexes)."""
    return [history[i] for i in comparable_indexes(history, entry)]


def _fastest(history: list[dict], indexes: list[int]) -> int | None:
    # On a tie the newest: the one whose code and setup are still most likely on the target.
    return max(indexes, key=lambda i: (history[i]["tokens_per_s"], i)) if indexes else None


def fastest_comparable(history: list[dict], entry: dict) -> int | None:
    """Index of the fastest healthy deployment of `entry`'s shape, or None."""
    return _fastest(history, comparable_indexes(history, entry))


def reference(history: list[dict], index: int) -> dict:
    """One deployment as a throughput reference: its number (as history.yml lists it),
    release, time, the tokens/s and per-stage seconds its health check measured."""
    entry = history[index]
    return {
        "number": index + 1,
        "release": entry.get("release"),
        "action": entry.get("action"),
        "time": entry.get("time"),
        "tokens_per_s": entry.get("tokens_per_s"),
        "stages": entry.get("stages"),
    }


def throughput_references(history: list[dict], index: int | None) -> dict:
    """What a running trainer of deployment `index` is compared with: that deployment's own
    health check and the fastest comparable healthy deployment (`current` says whether that
    is the same one). Either is None when history has no such figure."""
    if index is None:
        return {"health_check": None, "fastest": None}
    fastest = fastest_comparable(history, history[index])
    return {
        "health_check": reference(history, index) if rated(history[index]) else None,
        "fastest": None
        if fastest is None
        else dict(reference(history, fastest), current=fastest == index),
    }
