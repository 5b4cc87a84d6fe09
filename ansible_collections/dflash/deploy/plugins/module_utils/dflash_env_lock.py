# The environment lock (inventory data): its validation, its id, and matching wheels to it.
# Shared by the controller (preflight, wheelhouse) and the target-side environment module.
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess

# PEP 440 release with optional pre/post/dev parts and a local suffix (+cu128, +cpu).
_VERSION_RE = re.compile(
    r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$"
)
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PYTHON_RE = re.compile(r"^3\.\d+(\.\d+)?$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def normalize(name: str) -> str:
    """PEP 503 project name normalisation (dist-info and wheel names differ in case and -/_)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lock: dict) -> dict[str, str]:
    """Every locked wheel as {normalised name: version}: torch, triton and the rest."""
    pins = {normalize(name): str(version) for name, version in (lock.get("wheels") or {}).items()}
    for key in ("torch", "triton"):
        if lock.get(key):
            pins[key] = str(lock[key])
    return pins


# Where a lock's packages come from: wheels to install, or an interpreter adopted as it is.
SOURCES = ("wheelhouse", "index_url", "python")


def adopts(lock: dict) -> str | None:
    """The interpreter a lock adopts (source: {python: ...}), never installed into."""
    return (lock.get("source") or {}).get("python") or None


def lock_problems(lock: object, unhashed_ok: bool = False) -> list[str]:
    """Everything wrong with a lock, each naming the value and the fix; [] when it is valid.

    A lock a deploy installs must carry every wheel's hash unless `unhashed_ok`
    (dflash_env_lock_unhashed): a version alone does not say which file was built."""
    if not isinstance(lock, dict):
        return [f"dflash_env_lock must be a mapping (python, torch, wheels, source), got {lock!r}"]
    problems = []
    python = str(lock.get("python", ""))
    if not _PYTHON_RE.match(python):
        problems.append(
            f"dflash_env_lock.python '{python}' is not a Python version; "
            "write e.g. '3.11' or '3.11.2'"
        )
    names = dict((lock.get("wheels") or {}).items())
    names.update({key: lock[key] for key in ("torch", "triton") if lock.get(key)})
    for name, version in names.items():
        if not _NAME_RE.match(str(name)):
            problems.append(f"dflash_env_lock wheel name '{name}' is not a package name")
        if not _VERSION_RE.match(str(version)):
            problems.append(
                f"dflash_env_lock pins {name}=='{version}', which is not a version; write it as "
                "pip prints it, e.g. 2.11.0+cu128"
            )
    source = lock.get("source") or {}
    given = [key for key in SOURCES if source.get(key)]
    if len(given) != 1:
        problems.append(
            "dflash_env_lock.source needs exactly one of wheelhouse (a folder inside the target), "
            "index_url, or python (an interpreter that already holds the pins)"
            + (f"; it has {', '.join(given)}" if given else "")
        )
    elif given == ["python"] and not str(source["python"]).startswith("/"):
        problems.append(
            f"dflash_env_lock.source.python '{source['python']}' must be the absolute path of an "
            "interpreter on the target, e.g. /opt/torch/.venv/bin/python3"
        )
    pins = {normalize(str(n)) for n in names}
    for name, digests in (lock.get("sha256") or {}).items():
        if normalize(name) not in pins:
            problems.append(f"dflash_env_lock.sha256 names '{name}', which the lock does not pin")
        given = digests if isinstance(digests, list) else [digests]
        if not given or not all(_SHA_RE.match(str(digest)) for digest in given):
            problems.append(
                f"dflash_env_lock.sha256 of '{name}' is not a hex sha256 (or a list of them)"
            )
    missing = unhashed(lock)
    if missing and not unhashed_ok:
        problems.append(
            f"dflash_env_lock pins {len(missing)} wheel(s) without a sha256 "
            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}), so nothing "
            "proves the wheels installed are the ones locked: generate the lock with "
            "`make env-lock SPEC=<spec>` (docs/environment-lock.md), which records every "
            "wheel's hash, or set dflash_env_lock_unhashed: true to install them unchecked"
        )
    return problems


def hashes(lock: dict) -> dict[str, list[str]]:
    """{normalised name: [sha256, ...]}: any one of them is the wheel the lock means (a
    resolver lists one per file that fits the target)."""
    return {
        normalize(name): digests if isinstance(digests, list) else [digests]
        for name, digests in (lock.get("sha256") or {}).items()
    }


def unhashed(lock: dict) -> list[str]:
    """The pins without a hash, [] for an adopted interpreter (nothing is installed into it)."""
    if adopts(lock):
        return []
    return sorted(set(pinned(lock)) - set(hashes(lock)))


def lock_id(lock: dict) -> str:
    """Folder name of the env built from this lock: any change to what it pins is a new env.

    The source is left out: the same pins (and hashes) from a moved wheelhouse are the same env;
    an adopted interpreter's path is in.
    """
    content = {key: value for key, value in lock.items() if key != "source"}
    if adopts(lock):
        # An adopted interpreter is its own env: another interpreter is another env.
        content["adopted_python"] = adopts(lock)
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return "lock-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    """(normalised name, version) from a wheel file name, or None for other files."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return None
    # Wheel file names escape '+' in local versions as is; '_' stands for '-' in names.
    return normalize(parts[0]), parts[1]


def pin_changes(before: dict[str, str | None], after: dict[str, str]) -> list[str]:
    """`name old -> new` for every package whose version differs, `(none)` for added/removed."""
    out = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old != new:
            out.append(f"{name} {old or '(none)'} -> {new or '(none)'}")
    return out


def requirement_lines(lock: dict) -> list[str]:
    """name==version per pin, each with its hashes where every pin has one (pip takes hashes
    on all lines or on none)."""
    digests = {} if unhashed(lock) or adopts(lock) else hashes(lock)
    return [
        f"{name}=={version}" + "".join(f" --hash=sha256:{d}" for d in digests.get(name, []))
        for name, version in sorted(pinned(lock).items())
    ]


def installed_versions(env_dir: str) -> dict[str, str]:
    """Versions from dist-info metadata: no import, so it is fast and trusts nothing in the env."""
    found: dict[str, str] = {}
    for site in sorted(glob.glob(os.path.join(env_dir, "lib", "python3*", "site-packages"))):
        for name, version in _site_versions(site).items():
            found.setdefault(name, version)
    return found


def interpreter_versions(python: str) -> dict[str, str] | None:
    """What an adopted interpreter imports, from the dist-info of its sys.path (first one
    wins, as for import); None when it does not run."""
    try:
        proc = subprocess.run(
            [python, "-E", "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        paths = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if paths is None:
        return None
    found: dict[str, str] = {}
    for folder in paths:
        for name, version in _site_versions(folder or ".").items():
            found.setdefault(name, version)
    return found


# torch's own record of its build (`__version__ = '2.11.0+cu130'`), written when it is built:
# some images' dist-info drops the local suffix that this file, and torch.__version__, keep.
_TORCH_VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def _site_versions(site: str) -> dict[str, str]:
    """The dist-info versions of one site-packages folder, torch's with its build suffix."""
    found = _metadata_versions(glob.glob(os.path.join(site, "*.dist-info", "METADATA")))
    if "torch" in found:
        try:
            with open(os.path.join(site, "torch", "version.py"), encoding="utf-8") as handle:
                match = _TORCH_VERSION.search(handle.read())
        except OSError:
            match = None
        if match and match[1].split("+")[0] == found["torch"].split("+")[0]:
            found["torch"] = match[1]
    return found


def _metadata_versions(files: list[str]) -> dict[str, str]:
    found = {}
    for metadata in files:
        name = version = None
        with open(metadata, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                if (name and version) or not line.strip():
                    break
        if name and version:
            found[normalize(name)] = version
    return found


def version_drift(lock: dict, installed: dict[str, str]) -> list[dict]:
    """Every package that differs from the pins. A built env must hold nothing else; an adopted
    interpreter (an image's) holds much else, so only its pins count."""
    drift = []
    pins = pinned(lock)
    names = set(pins) if adopts(lock) else set(pins) | set(installed)
    for name in sorted(names):
        if not matches(pins.get(name), installed.get(name)):
            drift.append(
                {"package": name, "expected": pins.get(name), "found": installed.get(name)}
            )
    return drift


def matches(pin: str | None, found: str | None) -> bool:
    """A pin is met by exactly its version; one without a local label (PyPI's torch 2.11.0)
    also by that version with one (2.11.0+cu130, as torch reports its build), as PEP 440's
    == does: the lock's `cuda` then says which build it must be."""
    if pin is None or found is None:
        return pin == found
    return found == pin or ("+" not in pin and found.split("+")[0] == pin)
