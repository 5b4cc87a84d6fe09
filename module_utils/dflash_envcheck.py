# What a lock needs from its target before anything is built (README "The environment
# lock"): the Python it names and, for a wheelhouse source, every pinned wheel with its hash.
# Shared by preflight (through the facts module: before any change) and the env module.
from __future__ import annotations

import glob
import os
import shutil
import subprocess

from ansible.module_utils.dflash_lock import normalize, pinned, wheel_name_version
from ansible.module_utils.dflash_release import sha256_file


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
            "container (Proxmox mpN) or fix dflash_lock.source.wheelhouse"
        )
    found = {}
    for path in glob.glob(os.path.join(folder, "*.whl")):
        parsed = wheel_name_version(os.path.basename(path))
        if parsed:
            found[parsed] = path
    return found


def check_wheelhouse(lock: dict, folder: str) -> dict[tuple[str, str], str]:
    """Every pinned wheel is there, with the locked hash where one is given."""
    files = wheelhouse_files(folder)
    hashes = {normalize(k): v for k, v in (lock.get("sha256") or {}).items()}
    for name, version in sorted(pinned(lock).items()):
        path = files.get((name, version))
        if path is None:
            have = sorted(v for (n, v) in files if n == name)
            raise EnvError(
                f"the lock pins {name}=={version} but the wheelhouse {folder} has "
                f"{'versions ' + ', '.join(have) if have else 'no ' + name + ' wheel'}; add that "
                "wheel (ansible-playbook playbooks/wheelhouse.yml) or fix the lock"
            )
        if name in hashes and sha256_file(path) != hashes[name]:
            raise EnvError(
                f"{os.path.basename(path)} in {folder} has sha256 {sha256_file(path)}, the lock "
                f"says {hashes[name]}; replace the wheel or fix dflash_lock.sha256.{name}"
            )
    return files


def lock_target_problems(lock: dict) -> list[str]:
    """What keeps this lock from being built on this target; [] when nothing does."""
    problems = []
    for check in (lambda: find_python(str(lock["python"])), lambda: check_source(lock)):
        try:
            check()
        except EnvError as err:
            problems.append(str(err))
    return problems


def check_source(lock: dict) -> None:
    source = lock.get("source") or {}
    if source.get("wheelhouse"):
        check_wheelhouse(lock, source["wheelhouse"])
