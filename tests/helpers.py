"""Running the toolkit's playbooks for real, as a user would, and reading what they did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The ansible-playbook of the interpreter running the tests (the project venv).
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
_RECAP = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)"
    r"\s+unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@dataclass
class PlaybookRun:
    rc: int
    output: str
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    report: dict | None = None

    def changed(self, host: str = "local") -> int:
        return self.recap[host]["changed"]

    @property
    def text(self) -> str:
        """The output with every run of whitespace made one space: messages as one line,
        however the YAML callback wrapped them."""
        return " ".join(self.output.split())


# ansible.cfg shows only what changed, failed, warned or was said; the tests read the banners
# of tasks as they start (kill points) and of tasks that ran or were skipped, so they see every
# task unless `extra` says otherwise (tests/integration/test_local_output.py: what users see).
EVERY_TASK = {"ANSIBLE_DISPLAY_OK_HOSTS": "true", "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "true"}


def local_env_lock(wheelhouse: Path | str | None = None) -> dict:
    """The embedded local target's CPU lock as inventory/local.yml renders it: the wheels and
    hashes of inventory/env-locks/cpu.yml, from the checkout's wheelhouse (or `wheelhouse`)."""
    import yaml

    lock = yaml.safe_load((REPO / "inventory" / "env-locks" / "cpu.yml").read_text())
    return {**lock, "source": {"wheelhouse": str(wheelhouse or REPO / ".build" / "wheelhouse")}}


def local_inventory() -> dict:
    """inventory/local.yml as data for a copy written elsewhere: what it derives from its own
    folder (the checkout, the lock file beside it) made absolute, so the copy works anywhere."""
    import yaml

    text = (REPO / "inventory" / "local.yml").read_text()
    inventory = yaml.safe_load(text.replace("{{ inventory_dir | dirname }}", str(REPO)))
    host = inventory["all"]["children"]["dflash_targets"]["hosts"]["local"]
    host["dflash_env_lock"] = local_env_lock()
    return inventory


def playbook_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ansible-playbook runs in: this process's, every task shown, `extra` (a
    user's shell variables) and the repo's ansible.cfg."""
    env = {**os.environ, **EVERY_TASK, **(extra or {})}
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def playbook_command(
    name: str,
    extravars: dict,
    inventory: Path | None = None,
    check: bool = False,
    tags: str | None = None,
) -> list[str]:
    cmd = [str(ANSIBLE_PLAYBOOK), str(REPO / name), "-e", json.dumps(extravars)]
    if inventory:
        cmd += ["-i", str(inventory)]
    if check:
        cmd += ["--check", "--diff"]
    if tags:
        cmd += ["--tags", tags]
    return cmd


def run_playbook(
    name: str,
    extravars: dict,
    inventory: Path | None = None,
    check: bool = False,
    tags: str | None = None,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> PlaybookRun:
    proc = subprocess.run(
        playbook_command(name, extravars, inventory, check, tags),
        cwd=REPO,
        env=playbook_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = proc.stdout + proc.stderr
    recap = {
        m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
        for m in _RECAP.finditer(output)
    }
    return PlaybookRun(rc=proc.returncode, output=output, recap=recap)


def dflash_package_files() -> dict[str, str]:
    """This checkout's dflash/ package, path (from the repository root) to text: the trainer
    that a test's or a bench's own git source commits."""
    return {
        str(path.relative_to(REPO)): path.read_text()
        for path in (REPO / "dflash").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def git_source(repo: Path) -> Callable[[str, dict[str, str]], Path]:
    """A new git checkout at `repo`; call the result as commit(tag, files) to add a commit
    (tagged unless the tag is empty)."""
    (repo / "dflash").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)

    def commit(tag: str, files: dict[str, str]) -> Path:
        for rel, text in files.items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", tag or "untagged"], check=True)
        if tag:
            subprocess.run([*git, "tag", tag], check=True)
        return repo

    return commit


def seed_target(root: Path, envs: Path) -> None:
    """A new state root holding a hard-linked copy of a built envs/ (the env module checks it
    like any other), so a test does not spend ~40 s building torch's env."""
    root.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(envs), str(root / "envs")], check=True)


def build_wheel(folder: Path, name: str, version: str, payload_mb: int = 0) -> Path:
    """A minimal pure-Python wheel (one module), for env tests that need no index; with
    `payload_mb`, also a file of that many MB of zeros (packed, a few KB: installed, the MB)."""
    import base64
    import hashlib
    import zipfile

    dist = name.replace("-", "_")
    module = f"{dist}.py"
    files = {
        module: f"VERSION = {version!r}\n",
        f"{dist}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ),
        f"{dist}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: dflash-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    if payload_mb:
        files[f"{dist}_payload.txt"] = "0" * (payload_mb * 1024 * 1024)
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}-{version}.dist-info/RECORD,,")
    files[f"{dist}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def with_tokens_per_s(history: str, release: str, tokens_per_s: float) -> str:
    """history.jsonl's text with the tokens/s that the newest healthy line of `release`
    recorded at its health check set: a reference figure a test controls, where a measured one
    would be noise."""
    lines = [json.loads(line) for line in history.splitlines() if line.strip()]
    index = max(
        i for i, e in enumerate(lines) if e["release"] == release and e["result"] == "healthy"
    )
    lines[index]["tokens_per_s"] = tokens_per_s
    lines[index]["unstarved_tokens_per_s"] = tokens_per_s  # what verify compares windows with
    return "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)


def record_tokens_per_s(root: Path, release: str, tokens_per_s: float) -> None:
    """with_tokens_per_s() on the history.jsonl of a local state root."""
    path = root / "history.jsonl"
    path.write_text(with_tokens_per_s(path.read_text(), release, tokens_per_s))
