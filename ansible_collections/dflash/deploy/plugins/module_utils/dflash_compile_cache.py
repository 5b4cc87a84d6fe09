# The compile cache of a build (TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR under
# <root>/cache/<fingerprint>), owned here: the fingerprint that names its folder, its marker
# (built-by.json: what built it, written after a warmup), what a read of it reports, the
# changes a deploy makes to it, and what verify says of it. The controller (naming the folder,
# verify's findings) and the target (dflash_facts, the dflash_compile_cache module) use the
# same rules. Standard library only.
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import tree_sha256
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    CACHE,
    read_json,
    write_json_atomic,
)

MARKER = "built-by.json"
# A cache whose compiled step failed its canary is renamed <folder>.failed-<UTC time>, with this
# file inside saying why (the trainer's supervisor does the same: dflash/supervision/record.py).
FAILED = "FAILED.json"
FAILED_INFIX = ".failed-"
# The exit code of a warmup or trainer whose compiled step failed its canary
# (dflash/supervision/record.py CACHE_SUSPECT_EXIT; a unit test keeps the two equal).
CACHE_SUSPECT_EXIT = 3
# The release's list of the files its compiled code is keyed by (dflash/compiled.py: FILES).
COMPILED_LIST = "dflash/compiled.py"
# The hashes of a cache's files are the trainer's (dflash/cache_files.py writes and checks
# hashes.json): the toolkit runs that module of the release, with the target's own Python (it
# needs the standard library only), never a copy of its rules.
HASHES_MODULE = "dflash/cache_files.py"


class CompiledListError(ValueError):
    """A release's dflash/compiled.py cannot be read as a list of its own files."""


def listed_files(source: bytes) -> list[str]:
    """FILES of a dflash/compiled.py, read without importing it (it may be another release's)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FILES" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
                return sorted(value)
    raise CompiledListError(f"{COMPILED_LIST} has no FILES = (...) tuple of paths")


def code_key(files: dict[str, str], compiled_list: bytes | None) -> dict:
    """The part of a cache's identity that the release's code decides: the hash of the files
    its compiled code is keyed by ({path: sha256} of the release), or for a release from before
    that list (no dflash/compiled.py) its whole tree, as then."""
    if compiled_list is None:
        return {"tree_sha256": tree_sha256(files)}
    listed = listed_files(compiled_list)
    missing = [path for path in listed if path not in files]
    if missing:
        raise CompiledListError(
            f"{COMPILED_LIST} names {', '.join(missing)}, which the release does not hold; "
            "correct its FILES"
        )
    return {"compiled_sha256": tree_sha256({path: files[path] for path in listed})}


def identity(lock: dict | None, gpu: dict | None, code: dict) -> dict:
    """What a cache is only ever used by: the torch, Triton and CUDA of the env lock, the GPU
    model and driver (the first GPU's; 'cpu' without one) and the code key (code_key)."""
    lock, gpu = lock or {}, gpu or {}
    return {
        "torch": lock.get("torch"),
        "triton": lock.get("triton"),
        "cuda": lock.get("cuda"),
        "gpu": gpu.get("name") or "cpu",
        "driver": gpu.get("driver"),
        **code,
    }


# What a marker records beside the identity: how the warmup ran (the trainer flags that shape
# the compiled step, the trainer's environment). They decide whether a warmup must run again,
# never the folder's name.
WARMUP_INPUTS = ("warmup_flags", "warmup_env")


def identity_of(built_by: dict) -> dict:
    """A marker's (or a `wanted`'s) identity: what names its folder."""
    return {k: v for k, v in built_by.items() if k not in WARMUP_INPUTS}


def fingerprint(built_by: dict) -> str:
    return hashlib.sha256(json.dumps(built_by, sort_keys=True).encode()).hexdigest()[:16]


def folder(root: str, built_by: dict) -> str:
    return os.path.join(root, CACHE, fingerprint(built_by))


def cache_files(code_dir: str, cache_dir: str, action: str, by: str) -> dict | None:
    """`python -m dflash.cache_files <action> <cache_dir>` of the release in `code_dir`
    (`check`, or `repair`: damaged files moved aside): its JSON answer; None when that release
    predates hashes or the folder is missing; {error} when it could not run."""
    if not os.path.isfile(os.path.join(code_dir, HASHES_MODULE)) or not os.path.isdir(cache_dir):
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env.update(PYTHONPATH=code_dir, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "dflash.cache_files", action, "--by", by, cache_dir]
    ran = subprocess.run(
        command, cwd=code_dir, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    try:
        return json.loads(ran.stdout)
    except ValueError:
        return {"error": (ran.stderr or ran.stdout).strip()[-500:] or f"exit {ran.returncode}"}


def read(root: str, cache_dir: str | None) -> dict | None:
    """The cache folder a deployment uses: whether it exists, its marker, every cache folder
    under the root, and its files against their recorded hashes (checked by the current
    release); None when the deployment names none."""
    if not cache_dir:
        return None
    parent = os.path.join(root, CACHE)
    names = sorted(os.listdir(parent)) if os.path.isdir(parent) else []
    return {
        "path": cache_dir,
        "exists": os.path.isdir(cache_dir),
        "built_by": read_json(os.path.join(cache_dir, MARKER)),
        "all": names,
        "moved_aside": moved_aside(parent, names),
        "hashes": cache_files(os.path.join(root, "current"), cache_dir, "check", "verify"),
    }


def repair(code_dir: str, cache_dir: str, dry_run: bool) -> tuple[list[str], str | None]:
    """A deploy's part: move the files that differ from their recorded hashes aside (with
    dry_run, say it would): (what was done, one line or none; the folder they went to)."""
    found = cache_files(code_dir, cache_dir, "check" if dry_run else "repair", "deploy.yml")
    if not found:
        return [], None
    if "error" in found:
        raise OSError(f"cannot check the hashes of {cache_dir}: {found['error']}")
    damaged = found["damaged"]
    if not damaged:
        return [], None
    named = ", ".join(damaged[:5]) + (", ..." if len(damaged) > 5 else "")
    aside = found.get("moved_aside")
    where = f"aside to {aside}" if aside else "aside"
    verb = "would move" if dry_run else "moved"
    line = (
        f"{verb} {len(damaged)} file(s) of {cache_dir} that differ from the hashes recorded when "
        f"they were compiled {where} ({named}); the trainer compiles them anew"
    )
    return [line], aside


def prepare(root: str, cache_dir: str, clear: bool, clear_all: bool, dry_run: bool) -> list[str]:
    """Clear the cache (every fingerprint's with clear_all) and make sure the folder exists;
    what was done, one line each ([] when nothing changed)."""
    done = []
    doomed = os.path.join(root, CACHE) if clear_all else cache_dir
    if clear and os.path.lexists(doomed):
        done.append(f"removed {doomed}")
        if not dry_run:
            shutil.rmtree(doomed)
    if dry_run and done:
        return [*done, f"created {cache_dir}"]
    if not os.path.isdir(cache_dir):
        done.append(f"created {cache_dir}")
        if not dry_run:
            os.makedirs(cache_dir, mode=0o755)
    return done


def move_aside(cache_dir: str, reason: str) -> str:
    """Rename a suspect cache out of the way (kept, for a person to look at) and say why in it;
    the next compilation starts on an empty folder."""
    now = time.time()
    base = f"{cache_dir}{FAILED_INFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}"
    aside, count = base, 1
    while os.path.lexists(aside):  # another set aside within the same second
        count += 1
        aside = f"{base}-{count}"
    os.rename(cache_dir, aside)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    write_json_atomic(os.path.join(aside, FAILED), {"reason": reason, "time": stamp})
    return aside


def moved_aside(parent: str, names: list[str]) -> list[dict]:
    """The caches moved aside under `parent`, newest first: name, and why and when (FAILED.json)."""
    out = []
    for name in sorted((n for n in names if FAILED_INFIX in n), reverse=True):
        said = read_json(os.path.join(parent, name, FAILED)) or {}
        out.append({"name": name, "reason": said.get("reason"), "time": said.get("time")})
    return out


def warm_needed(cache_dir: str, wanted: dict) -> bool:
    """Whether a warmup must run: the marker does not record exactly this build and these
    warmup flags (a marker is written only after a warmup completed)."""
    return read_json(os.path.join(cache_dir, MARKER)) != wanted


def mark(cache_dir: str, built_by: dict) -> None:
    """Record what built the cache, whole or not at all."""
    write_json_atomic(os.path.join(cache_dir, MARKER), built_by)


def built_for(built_by: dict) -> str:
    """`torch 2.11.0+cu130 on NVIDIA H200, code 3f2a...`: a marker as a person reads it."""
    code = built_by.get("compiled_sha256") or built_by.get("tree_sha256")
    return f"torch {built_by.get('torch')} on {built_by.get('gpu')}, code {str(code)[:12]}"


def findings(cache: dict | None, lock: dict, processes: list[dict]) -> list[dict]:
    """verify's `cache` findings: files of the deployment's cache differ from the hashes
    recorded when they were compiled, the folder is gone, its marker says it was built for
    another identity than its name (a folder copied or moved by hand) or another torch than the
    lock's, or a running trainer uses another folder."""
    if not cache:
        return []
    out = []
    damaged = (cache.get("hashes") or {}).get("damaged")
    if damaged:
        named = ", ".join(damaged[:5]) + (", ..." if len(damaged) > 5 else "")
        out.append(
            finding(
                "cache",
                f"{cache['path']}: its files as compiled (hashes.json)",
                f"{len(damaged)} file(s) differ from their recorded hashes: {named}",
                "a damaged compiled file runs as it is (a crash, or wrong numbers): deploy.yml "
                "moves them aside now, the trainer's supervisor before its next start; the "
                "trainer compiles them anew",
                path=cache["path"],
            )
        )
    if not cache.get("exists"):
        out.append(
            finding(
                "cache", cache["path"], "missing", "deploy.yml creates it again", path=cache["path"]
            )
        )
    built = cache.get("built_by")
    if built and (fingerprint(identity_of(built)) != os.path.basename(cache["path"])
                  or built.get("torch") != lock.get("torch")):  # fmt: skip
        out.append(
            finding(
                "cache",
                f"a cache named {os.path.basename(cache['path'])}, torch {lock.get('torch')}",
                f"built for {built_for(built)}",
                "a cache of another build is in place; deploy.yml -e dflash_compile_cache=clear",
                path=cache["path"],
            )
        )
    named: set[int] = set()
    for proc in processes:
        # One finding per trainer: its supervisor, torchrun and ranks all carry the cache dir.
        job = proc.get("job", proc["pid"])
        if proc.get("cache_dir") and proc["cache_dir"] != cache["path"] and job not in named:
            named.add(job)
            out.append(
                finding(
                    "cache",
                    cache["path"],
                    f"pid {job} uses {proc['cache_dir']}",
                    "restart it through deploy.yml -e dflash_restart=true",
                    pid=job,
                )
            )
    return out
