# The training data a deployment names (dflash_data; docs/training-data.md): what is on the
# target at that path, read without reading the data (a store's manifest and its files' sizes,
# a JSONL file's size and time), and whether a running trainer's data (the manifest summary in
# its status.json) is still what lies there. Standard library only: the target's modules and
# the controller's filters use it alike.
from __future__ import annotations

import json
import os
from datetime import UTC, datetime

SELF_GENERATED = "self_generated"
STORE_MANIFEST = "manifest.json"
# A store's manifest says which of its keys a run reports (`summary_keys`) and each file's size
# (`bytes`), so a release that adds a key, an array or a dtype is followed without an edit here.
# A store prepared by a release from before those fields (0.2.0 and older) is read as those
# releases wrote it, frozen: they no longer change.
BEFORE_SUMMARY_KEYS = ("content_sha256", "samples", "tokens", "supervised_tokens", "lengths",
                       "max_token_id", "sources", "tokenizer", "settings", "created")  # fmt: skip


def _mtime(path: str) -> str:
    stamp = os.stat(path).st_mtime
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")


def read_data(path: str | None) -> dict:
    """The data at `path` on this machine: `kind` self_generated, store, jsonl, missing or
    unreadable; a store with its manifest's summary, `problems` (arrays whose size is not
    the manifest's) and its `format` and `version` (what a release reads is its own: preflight
    holds them to it), a JSONL file with its size and mtime."""
    if not path or path == SELF_GENERATED:
        return {"kind": SELF_GENERATED}
    if os.path.isdir(path):
        return _read_store(path)
    if os.path.isfile(path):
        try:
            return {"kind": "jsonl", "path": path, "size": os.path.getsize(path),
                    "mtime": _mtime(path)}  # fmt: skip
        except OSError as exc:
            return {"kind": "unreadable", "path": path, "error": str(exc)}
    return {"kind": "missing", "path": path}


def _read_store(path: str) -> dict:
    try:
        with open(os.path.join(path, STORE_MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return {"kind": "unreadable", "path": path,
                "error": f"no {STORE_MANIFEST}: not a prepared store"}  # fmt: skip
    except (OSError, ValueError) as exc:
        return {"kind": "unreadable", "path": path, "error": f"{STORE_MANIFEST}: {exc}"}
    arrays = manifest.get("arrays") if isinstance(manifest, dict) else None
    if not isinstance(arrays, dict) or not arrays:
        return {"kind": "unreadable", "path": path,
                "error": f"{STORE_MANIFEST} has no arrays table: not a prepared store"}  # fmt: skip
    problems = []
    for entry in arrays.values():
        file = os.path.join(path, str(entry.get("file")))
        size = os.path.getsize(file) if os.path.isfile(file) else None
        want = _bytes(entry)
        if size != want:
            problems.append(f"{entry.get('file')} holds {size} bytes, its manifest says {want}")
    keys = manifest.get("summary_keys") or BEFORE_SUMMARY_KEYS
    summary = {key: manifest[key] for key in keys if key in manifest}
    return {"kind": "store", "path": path, "manifest": summary, "problems": problems,
            "format": manifest.get("format"), "version": manifest.get("version")}  # fmt: skip


def _bytes(entry: dict) -> int:
    """An array file's size as its manifest says it; a manifest from before `bytes` gives the
    count and numpy's dtype string, which ends in the item size ("<i4", "|u1", "<i8")."""
    if "bytes" in entry:
        return int(entry["bytes"])
    return int(entry.get("count", 0)) * int(str(entry.get("dtype", "x1"))[-1])


def store_refused(data: dict | None, store: dict | None) -> str:
    """Why a release whose store format is `store` (its `python -m dflash.contracts`) would
    refuse the store `data` (read_data) at start: another format or version; "" when it reads
    it, or when either is unknown (not a store; a release from before its contracts)."""
    if not data or data.get("kind") != "store" or not store:
        return ""
    found = (data.get("format"), data.get("version"))
    wanted = (store.get("format"), store.get("version"))
    if found == wanted:
        return ""
    return (
        f"the store is {found[0]} version {found[1]}, the release reads {wanted[0]} version "
        f"{wanted[1]}"
    )


def identity(data: dict | None) -> str:
    """One string that two hosts of a job (or two deployments) share when they train on the
    same data: a store's content hash, a JSONL file's name and size, or self_generated."""
    data = data or {}
    kind = data.get("kind")
    if kind == "store":
        return f"store {(data.get('manifest') or {}).get('content_sha256')}"
    if kind == "jsonl":
        return f"jsonl {os.path.basename(str(data.get('path')))} {data.get('size')} bytes"
    if kind == SELF_GENERATED:
        return SELF_GENERATED
    return f"{kind} {data.get('path')}"


def recorded(data: dict | None) -> dict | None:
    """What a history line records of the data read on the target (before a trainer reports
    its own): the kind, the path and the store's summary or the file's size and time."""
    if not data:
        return None
    out = {key: data[key] for key in ("kind", "path", "size", "mtime") if key in data}
    out.update(data.get("manifest") or {})
    return out


def changed_under(reported: dict | None, now: dict | None) -> str | None:
    """How the data a running trainer reported (status.json `data`) differ from what lies at
    its path now; None when they are the same or cannot be compared (self-generated data)."""
    reported = reported or {}
    kind, path = reported.get("kind"), reported.get("path")
    if kind not in ("store", "jsonl") or not path:
        return None
    now = now or {}
    if now.get("kind") in ("missing", "unreadable"):
        return f"{path} is {now['kind']}" + (f" ({now['error']})" if now.get("error") else "")
    if kind == "store":
        if now.get("kind") != "store":
            return f"{path} is no longer a store (now {now.get('kind')})"
        was = str(reported.get("content_sha256"))
        found = str((now.get("manifest") or {}).get("content_sha256"))
        if found != was:
            return f"the store at {path} was prepared again (sha256 {was[:12]} -> {found[:12]})"
        if now.get("problems"):
            return f"the store at {path} changed on disk: {'; '.join(now['problems'])}"
        return None
    source = next(iter(reported.get("sources") or []), {})
    if now.get("kind") != "jsonl":
        return f"{path} is no longer a file (now {now.get('kind')})"
    then = (source.get("size"), source.get("mtime"))
    if then != (now.get("size"), now.get("mtime")):
        return (
            f"the file {path} changed (size {then[0]} -> {now.get('size')}, modified "
            f"{then[1]} -> {now.get('mtime')})"
        )
    return None


def running_data(processes: list[dict]) -> dict[str, dict]:
    """The `data` each trainer's status.json reports, by path (the paths facts must read)."""
    found = {}
    for proc in processes:
        data = (proc.get("status") or {}).get("data") or {}
        if data.get("kind") in ("store", "jsonl") and data.get("path"):
            found[str(data["path"])] = data
    return found


# A percentile that moves by more than this share is a change of workload, not noise.
LENGTH_SHIFT = 0.1


def length_shift(then: dict | None, now: dict | None) -> str | None:
    """What changed in the data between two runs, for the throughput finding's hint: sample
    lengths that moved (longer samples train at other tokens/s), or other data of like
    lengths; None when both name the same data or either is unknown."""
    then, now = then or {}, now or {}
    before, after = then.get("content_sha256"), now.get("content_sha256")
    if not before or not after or before == after:
        return None
    old, new = then.get("lengths") or {}, now.get("lengths") or {}
    moved = [
        f"{key} {old[key]} -> {new[key]}"
        for key in ("p50", "p90", "max")
        if old.get(key) and new.get(key) is not None
        and abs(new[key] - old[key]) > LENGTH_SHIFT * old[key]
    ]  # fmt: skip
    if moved:
        return (
            f"the data's sample lengths moved ({', '.join(moved)} tokens): longer or shorter "
            "samples change tokens/s; rule that out first"
        )
    return f"the data changed (sha256 {before[:12]} -> {after[:12]}), with lengths alike"


def diff_fields(data: dict | None) -> dict[str, object]:
    """A history line's data as flat name: value pairs, for diff.yml's data section."""
    data = data or {}
    flat: dict[str, object] = {
        key: data.get(key)
        for key in ("kind", "path", "content_sha256", "samples", "tokens", "supervised_tokens")
    }
    for key, value in (data.get("lengths") or {}).items():
        flat[f"lengths.{key}"] = value
    for key, value in (data.get("settings") or {}).items():
        flat[f"settings.{key}"] = value
    for key, value in (data.get("generated") or {}).items():
        flat[f"generated.{key}"] = value
    sources = data.get("sources") or []
    if sources:
        # Short enough for diff.yml's 40-character columns: name, sha256 prefix, size.
        flat["sources"] = ", ".join(
            f"{s.get('name')} {str(s.get('sha256'))[:8]} ({s.get('size')} B)" for s in sources
        )
    tokenizer = data.get("tokenizer") or {}
    if tokenizer:
        flat["tokenizer"] = f"{tokenizer.get('name')} ({str(tokenizer.get('sha256'))[:12]})"
    if data.get("kind") == "jsonl" and not data.get("content_sha256"):
        flat.update(size=data.get("size"), mtime=data.get("mtime"))
    return {key: value for key, value in flat.items() if value is not None}
