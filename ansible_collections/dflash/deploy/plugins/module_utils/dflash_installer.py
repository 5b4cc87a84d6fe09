# The installer of an env build: uv where the wheelhouse holds its wheel (or the target has uv),
# pip otherwise. Either installs exactly the lock's pins with --no-deps, binary wheels only, with
# the lock's hashes where it has them, and reads no user or site configuration.
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import unhashed
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_envcheck import EnvError

# The uv the wheelhouse carries for the targets: the Makefile's UV_VERSION (a unit test holds
# them equal), so controller and targets resolve and install with one uv.
UV_VERSION = "0.13.9"


def uv_binary(files: dict, workdir: str) -> str | None:
    """uv from its wheel in the wheelhouse (unpacked into `workdir`), else uv on PATH; None
    where neither runs here (another CPU or C library than the wheel's: pip then installs)."""
    wheels = sorted(path for (name, _v), path in files.items() if name == "uv")
    found = unpack_uv(wheels[-1], workdir) if wheels else shutil.which("uv")
    if not found:
        return None
    try:
        probe = subprocess.run([found, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if probe.returncode == 0 else None


def unpack_uv(wheel: str, workdir: str) -> str | None:
    with zipfile.ZipFile(wheel) as archive:
        member = next((n for n in archive.namelist() if n.endswith(".data/scripts/uv")), None)
        if member is None:
            return None
        target = os.path.join(workdir, "uv")
        with archive.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR)
    return target


def pip_base(env_python: str, files: dict) -> list[str]:
    pip_wheels = sorted(path for (name, _v), path in files.items() if name == "pip")
    if pip_wheels:
        # pip runs straight from its wheel, so the env (and the container) needs no pip.
        return [env_python, os.path.join(pip_wheels[-1], "pip")]
    system_python = shutil.which("python3")
    probe = (
        subprocess.run([system_python, "-m", "pip", "--version"], capture_output=True, check=False)
        if system_python
        else None
    )
    if not probe or probe.returncode != 0:
        raise EnvError(
            "no pip to install with: put a pip wheel into the lock's wheelhouse "
            "(playbooks/wheelhouse.yml does) or install python3-pip on the target"
        )
    return [system_python, "-m", "pip", "--python", env_python]


def install_command(
    lock: dict, env_python: str, files: dict, workdir: str
) -> tuple[list[str], dict[str, str], str]:
    """(command without the requirements file, its environment, what it is called)."""
    source = lock["source"]
    where = (
        ["--no-index", "--find-links", source["wheelhouse"]]
        if source.get("wheelhouse")
        else ["--index-url", source["index_url"]]
    )
    hashes = [] if unhashed(lock) else ["--require-hashes"]
    uv = uv_binary(files, workdir)
    if uv:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        cmd = [
            uv, "pip", "install", "--python", env_python, "--no-config", "--no-cache",
            "--no-deps", "--only-binary", ":all:", "--link-mode", "copy",
            # As pip does: compiled at install, not at every import of a read-only release.
            "--compile-bytecode", *hashes, *where,
        ]  # fmt: skip
        return cmd, env, "uv pip install of the locked wheels"
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    cmd = [
        *pip_base(env_python, files), "install", *hashes, "--no-deps", "--only-binary=:all:",
        "--no-input", "--disable-pip-version-check", *where,
    ]  # fmt: skip
    return cmd, env, "pip install of the locked wheels"
