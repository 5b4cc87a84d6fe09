#!/usr/bin/python
# Resolves a short environment spec into a full lock (every wheel's version and sha256) with uv,
# for the target's Python and platform rather than the controller's.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_env_resolve
short_description: Resolve an environment spec into a dflash environment lock with hashes
description:
  - Reads a spec (the Python version, the target's platform tag, torch with its local version,
    triton, cuda, the other requirements, where the wheels come from) and resolves it with
    C(uv pip compile --python-platform) for that platform. The lock holds the full closure, each
    wheel's exact version and the sha256 of every file that fits the target.
  - Writes the lock as YAML (python, torch, triton, cuda, wheels, sha256), the shape of
    C(dflash_env_lock) less its C(source), which each inventory states. An unchanged lock is
    not written again.
  - Runs on the controller; it needs the index or the wheel folders the spec names, not the
    target.
options:
  spec:
    description:
      - The spec. Keys C(python) (e.g. C(3.11)), C(platform) (uv's C(--python-platform), e.g.
        C(x86_64-manylinux_2_28)), C(torch), C(triton) and C(cuda) (null on the CPU),
        C(requires) (a list of requirement strings, e.g. C(transformers==5.24.0)),
        C(index_url), C(extra_index_url) and C(find_links) (optional; uv takes a package from
        the first index that has it).
    type: dict
    required: true
  dest:
    description: The lock file to write.
    type: path
    required: true
  uv:
    description: The uv executable.
    type: path
    required: true
  find_links:
    description: More wheel folders or pages to look in (added to the spec's).
    type: list
    elements: str
    default: []
  source_name:
    description: What the lock file's first line says it was made from (the spec's path).
    type: str
    default: the spec
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
    details: In check mode resolves and reports the changes, and writes nothing.
  diff_mode:
    support: none
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Resolve the CPU spec
  dflash_env_resolve:
    spec: "{{ lookup('ansible.builtin.file', 'inventory/env-locks/cpu.in.yml') | from_yaml }}"
    dest: inventory/env-locks/cpu.yml
    uv: .build/uv/bin/uv
"""

RETURN = r"""
packages:
  description: How many wheels the lock pins.
  type: int
  returned: success
changes:
  description: Each pin that changed against the lock file that was there (name old -> new).
  type: list
  elements: str
  returned: success
dest:
  description: The lock file.
  type: str
  returned: success
"""

import os
import re
import subprocess
import tempfile
import tomllib

import yaml
from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_env_lock import (
    lock_problems,
    normalize,
    pin_changes,
    pinned,
)

_PLATFORM_RE = re.compile(r"^[a-z0-9_]+-[a-z0-9_]+$")
SPEC_KEYS = {
    "python", "platform", "torch", "triton", "cuda", "requires", "index_url", "extra_index_url",
    "find_links",
}  # fmt: skip


class SpecError(Exception):
    pass


def spec_problems(spec: dict) -> list[str]:
    problems = [f"the spec has '{key}', which is not one of {sorted(SPEC_KEYS)}"
                for key in sorted(set(spec) - SPEC_KEYS)]  # fmt: skip
    if not _PLATFORM_RE.match(str(spec.get("platform", ""))):
        problems.append(
            f"the spec's platform '{spec.get('platform')}' is not a uv platform; write the "
            "target's, e.g. x86_64-manylinux_2_28 (glibc 2.28 or newer on x86_64)"
        )
    if not spec.get("torch"):
        problems.append("the spec names no torch version (with its local suffix, e.g. 2.13.0+cpu)")
    if not isinstance(spec.get("requires", []), list):
        problems.append("the spec's requires must be a list of requirements")
    return problems


def compile_command(spec: dict, uv: str, infile: str, outfile: str, links: list) -> list[str]:
    cmd = [
        uv, "pip", "compile", infile, "--output-file", outfile, "--format", "pylock.toml",
        "--python-version", str(spec["python"]), "--python-platform", spec["platform"],
        "--no-header", "--quiet",
    ]  # fmt: skip
    if spec.get("index_url"):
        cmd += ["--index-url", spec["index_url"]]
    for url in spec.get("extra_index_url") or []:
        cmd += ["--extra-index-url", url]
    for link in [*(spec.get("find_links") or []), *links]:
        cmd += ["--find-links", link]
    return cmd


def lock_from(pylock: dict, spec: dict) -> dict:
    """The lock from uv's pylock.toml: every package as a pin with the hashes of its wheels
    (uv lists only the files that fit the platform); a package with no wheel fails."""
    pins, digests = {}, {}
    for package in pylock.get("packages", []):
        name = normalize(package["name"])
        files = package.get("wheels") or []
        if not files:
            raise SpecError(
                f"{name}=={package['version']} has no wheel for {spec['platform']} and Python "
                f"{spec['python']} (only an sdist): pin a version that has one, or build it into "
                "a wheel folder named in find_links"
            )
        pins[name] = str(package["version"])
        found = sorted({f["hashes"]["sha256"] for f in files})
        digests[name] = found[0] if len(found) == 1 else found
    lock = {
        "python": str(spec["python"]),
        "torch": pins.pop("torch", None),
        "triton": pins.pop("triton", None),
        "cuda": spec.get("cuda"),
        "wheels": pins,
        "sha256": digests,
    }
    if lock["torch"] is None:
        raise SpecError("the resolved closure has no torch: check the spec's torch version")
    return lock


def changes(before: dict | None, after: dict) -> list[str]:
    said = pin_changes(pinned(before or {}), pinned(after))
    if before and not said and before.get("sha256") != after.get("sha256"):
        said.append("the same versions, other files (their hashes changed)")
    return said


def render(lock: dict, source_name: str) -> str:
    head = (
        f"# Made by `make env-lock` from {source_name}: every wheel of the closure, its version\n"
        "# and the sha256 of each file that fits the target. Do not edit: change the spec and\n"
        "# run it again. (`source` is the inventory's: where the wheels come from.)\n"
    )
    return head + yaml.dump(
        lock, Dumper=_IndentedDumper, sort_keys=False, default_flow_style=False, width=100
    )


class _IndentedDumper(yaml.SafeDumper):
    """Lists indented under their key, as yamllint (ansible-lint) wants them."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def resolve(spec: dict, uv: str, links: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        infile, outfile = os.path.join(tmp, "spec.in"), os.path.join(tmp, "pylock.toml")
        lines = [f"torch=={spec['torch']}"]
        if spec.get("triton"):
            lines.append(f"triton=={spec['triton']}")
        lines += [str(req) for req in spec.get("requires") or []]
        with open(infile, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        cmd = compile_command(spec, uv, infile, outfile, links)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SpecError(f"uv did not run ({err}): `make env-lock` installs it") from err
        if proc.returncode != 0:
            raise SpecError(f"uv could not resolve the spec: {proc.stderr.strip()[-3000:]}")
        with open(outfile, "rb") as handle:
            return lock_from(tomllib.loads(handle.read().decode()), spec)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "spec": {"type": "dict", "required": True},
            "dest": {"type": "path", "required": True},
            "uv": {"type": "path", "required": True},
            "find_links": {"type": "list", "elements": "str", "default": []},
            "source_name": {"type": "str", "default": "the spec"},
        },
        supports_check_mode=True,
    )
    params = module.params
    problems = spec_problems(params["spec"])
    if problems:
        module.fail_json(msg="; ".join(problems))
    try:
        lock = resolve(params["spec"], params["uv"], params["find_links"])
    except SpecError as err:
        module.fail_json(msg=str(err))
    problems = lock_problems({**lock, "source": {"index_url": "-"}})
    if problems:
        module.fail_json(msg="the resolved lock is not valid: " + "; ".join(problems))
    before = None
    if os.path.exists(params["dest"]):
        with open(params["dest"], encoding="utf-8") as handle:
            before = yaml.safe_load(handle)
    text = render(lock, params["source_name"])
    said = changes(before, lock)
    changed = before != lock
    if changed and not module.check_mode:
        tmp = params["dest"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, params["dest"])
    module.exit_json(
        changed=changed,
        packages=len(pinned(lock)),
        changes=said if before else [f"{len(pinned(lock))} pins, new"],
        dest=params["dest"],
    )


if __name__ == "__main__":
    main()
