# What a lock needs from its target before anything is built (docs/environment-lock.md): the
# Python it names and, for a wheelhouse source, every pinned wheel with its hash.
# Shared by preflight (through the facts module: before any change) and the env module.
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_disk import (
    WHEEL_EXPANSION,
    tree_bytes,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    adopts,
    interpreter_versions,
    matches,
    pinned,
    version_drift,
    wheel_name_version,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    hashes as lock_hashes,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_guarded import (
    CommandError,
    run_checked,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import sha256_file

# Oldest driver that runs a CUDA major version (minor version compatibility).
MIN_DRIVER = {"11": (450, 80), "12": (525, 60), "13": (580, 65)}


class EnvError(Exception):
    pass


def find_python(wanted: str) -> str:
    """An interpreter of the locked version: 3.11 matches any 3.11.x, 3.11.2 only itself."""
    major_minor = ".".join(wanted.split(".")[:2])
    seen = []
    for candidate in (f"python{major_minor}", "python3"):
        path = shutil.which(candidate)
        if not path:
            continue
        proc = subprocess.run(
            [path, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=False,
        )
        version = proc.stdout.strip()
        seen.append(f"{path} ({version or 'broken'})")
        if version == wanted or (version.startswith(major_minor + ".") and wanted == major_minor):
            return path
    raise EnvError(
        f"the lock wants Python {wanted}, but the target has {', '.join(seen) or 'no python3'}; "
        f"install python{major_minor} in the container or lock the Python it has"
    )


def wheelhouse_files(folder: str) -> dict[tuple[str, str], str]:
    if not os.path.isdir(folder):
        raise EnvError(
            f"the lock's wheelhouse {folder} is not a folder on the target; mount it into the "
            "container (Proxmox mpN) or fix dflash_env_lock.source.wheelhouse"
        )
    found = {}
    for path in glob.glob(os.path.join(folder, "*.whl")):
        parsed = wheel_name_version(os.path.basename(path))
        if parsed:
            found[parsed] = path
    return found


def install_estimate(lock: dict, reference_env: str | None) -> tuple[int, str]:
    """About how many bytes an env of `lock` takes once built, and from what: its wheels' sizes
    times WHEEL_EXPANSION (a wheelhouse), else the size of `reference_env` (the current
    deployment's env: an index's wheel sizes are not known here); (0, why) without either."""
    source = lock.get("source") or {}
    if source.get("wheelhouse"):
        try:
            files = wheelhouse_files(source["wheelhouse"])
        except EnvError:
            return 0, "its wheelhouse is missing"
        paths = [files[key] for key in pinned(lock).items() if key in files]
        wheels = sum(os.path.getsize(path) for path in paths)
        return wheels * WHEEL_EXPANSION, f"{WHEEL_EXPANSION}x its {len(paths)} wheels"
    if reference_env and os.path.isdir(reference_env):
        return tree_bytes(reference_env), f"as large as {reference_env}"
    return 0, "its size is not known before it is built"


def check_wheelhouse(
    lock: dict, folder: str, check_hashes: bool = True
) -> dict[tuple[str, str], str]:
    """Every pinned wheel is there, with (where `check_hashes`) one of the locked hashes."""
    files = wheelhouse_files(folder)
    hashes = lock_hashes(lock) if check_hashes else {}
    for name, version in sorted(pinned(lock).items()):
        path = files.get((name, version))
        if path is None:
            have = sorted(v for (n, v) in files if n == name)
            raise EnvError(
                f"the lock pins {name}=={version} but the wheelhouse {folder} has "
                f"{'versions ' + ', '.join(have) if have else 'no ' + name + ' wheel'}; add that "
                "wheel (ansible-playbook playbooks/wheelhouse.yml) or fix the lock"
            )
        if name in hashes and (found := sha256_file(path)) not in hashes[name]:
            said = " or ".join(hashes[name])
            raise EnvError(
                f"{os.path.basename(path)} in {folder} has sha256 {found}, the lock says {said}: "
                "not the file that was locked. Download it again (remove it, then "
                "ansible-playbook playbooks/wheelhouse.yml) or make the lock again (make env-lock)"
            )
    return files


def lock_target_problems(lock: dict, check_hashes: bool = True) -> list[str]:
    """What keeps this lock from being built (or, an adopted interpreter, used) on this
    target; [] when nothing does."""
    checks = (
        [lambda: check_adopted(lock)]
        if adopts(lock)
        else [lambda: find_python(str(lock["python"])), lambda: check_source(lock, check_hashes)]
    )
    problems = []
    for check in checks:
        try:
            check()
        except (EnvError, CommandError) as err:
            problems.append(str(err))
    return problems


def check_adopted(lock: dict) -> dict:
    """An interpreter adopted as it is must hold every pin (and torch its CUDA build, and the
    driver be new enough); nothing is ever installed into it, so any difference is an error
    naming each package. Returns the runtime versions."""
    python = str(adopts(lock))
    if not os.access(python, os.X_OK):
        raise EnvError(
            f"dflash_env_lock.source.python {python} is not an executable on the target; point it "
            "at the interpreter that holds torch (e.g. /opt/torch/.venv/bin/python3)"
        )
    installed = interpreter_versions(python)
    if installed is None:
        raise EnvError(f"dflash_env_lock.source.python {python} does not run")
    drift = version_drift(lock, installed)
    version = run_checked(
        [python, "-E", "-c", "import platform; print(platform.python_version())"], 60,
        f"asking {python} for its version",
    ).strip()  # fmt: skip
    wanted = str(lock["python"])
    if not (version == wanted or version.startswith(wanted + ".")):
        drift.insert(0, {"package": "python", "expected": wanted, "found": version})
    if drift:
        raise EnvError(
            f"{python} does not hold the lock, and an adopted interpreter is never changed: "
            + "; ".join(
                f"{d['package']} {d['found'] or '(not installed)'}, the lock says {d['expected']}"
                for d in drift
            )
            + ". Lock what it holds, or use a wheelhouse or index_url source"
        )
    return check_runtime(lock, python)


def check_source(lock: dict, check_hashes: bool = True) -> None:
    source = lock.get("source") or {}
    if source.get("wheelhouse"):
        check_wheelhouse(lock, source["wheelhouse"], check_hashes)


def driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run(
        [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stdout.split()
    return lines[0] if proc.returncode == 0 and lines else None


def check_runtime(lock: dict, env_python: str) -> dict:
    if not lock.get("torch"):
        return {"torch": None, "cuda": None, "driver": driver_version()}
    out = run_checked(
        [
            env_python,
            "-c",
            "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))",
        ],
        300,
        "importing torch in the new env",
    )
    torch_version, cuda = json.loads(out.strip().splitlines()[-1])
    if not matches(str(lock["torch"]), torch_version):
        raise EnvError(f"torch.__version__ is {torch_version}, the lock says {lock['torch']}")
    if "cuda" in lock and (lock["cuda"] or None) != cuda:
        raise EnvError(f"torch.version.cuda is {cuda}, the lock says {lock['cuda']}")
    driver = driver_version()
    if cuda and driver:
        need = MIN_DRIVER.get(cuda.split(".")[0])
        have = tuple(int(x) for x in re.findall(r"\d+", driver)[:2])
        if need and have < need:
            raise EnvError(
                f"the NVIDIA driver {driver} is older than CUDA {cuda} needs "
                f"({need[0]}.{need[1]} or newer); upgrade the node's driver or lock a torch "
                "built for an older CUDA"
            )
    return {"torch": torch_version, "cuda": cuda, "driver": driver}
