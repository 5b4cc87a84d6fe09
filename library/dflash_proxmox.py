#!/usr/bin/python
# Preflight of one Proxmox LXC container through the Proxmox API (proxmoxer), run on the
# controller: it exists, it runs (started when asked), its config passes the GPUs through and
# has the mount points, and an optional snapshot before deploying, with retention.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_proxmox
short_description: Check (and prepare) a Proxmox LXC container before a deploy
description:
  - Runs on the controller (C(delegate_to) V(localhost)), once per container, and talks to the
    Proxmox API with proxmoxer, either over HTTPS with an API token or over SSH to the node
    (proxmoxer's C(ssh_paramiko) or C(openssh) backend, which run C(pvesh) on the node).
  - Checks that the container exists on the node, that it runs (starting it when
    O(start_if_stopped) is true, with a bounded wait), that its config passes the requested
    GPUs through (C(devN) entries, or C(lxc.mount.entry) lines with a C(c 195:*) cgroup rule),
    with C(/dev/nvidiactl) and C(/dev/nvidia-uvm) as well, and that the expected mount points
    exist.
  - Optionally takes a snapshot before the deploy and deletes the oldest snapshots this module
    made beyond O(snapshot.retain). Snapshots of other origins are never touched.
  - All config problems are reported together, and before anything is changed.
  - Reports C(changed) only when it started the container or took or deleted a snapshot. In
    check mode it reports what it would do, and does nothing.
options:
  api_host:
    description: Host name or address of the Proxmox node (API or SSH).
    type: str
    required: true
  api_port:
    description: Port of the API (HTTPS, default 8006) or of the node's SSH server (default 22).
    type: int
  backend:
    description:
      - How to reach the API. V(https) uses an API token; V(ssh_paramiko) and V(openssh) log in
        to the node over SSH and run C(pvesh) there (the SSH user needs to be root or allowed
        to run pvesh).
      - V(openssh) needs the Python package openssh_wrapper; V(https) needs requests.
    type: str
    choices: [https, ssh_paramiko, openssh]
    default: https
  api_user:
    description:
      - For V(https), the Proxmox user owning the token (default V(root@pam); a O(api_token_id)
        of the form C(user@realm!name) sets it too). For the SSH backends, the login user
        (default V(root)).
    type: str
  api_token_id:
    description:
      - Name of the API token (HTTPS), or C(user@realm!name).
      - Defaults to the environment variable E(PROXMOX_TOKEN_ID).
    type: str
  api_token_secret:
    description:
      - Secret of the API token (HTTPS). Never logged.
      - Defaults to the environment variable E(PROXMOX_TOKEN_SECRET).
    type: str
  verify_ssl:
    description: Verify the API's TLS certificate (HTTPS).
    type: bool
    default: true
  ssh_private_key_file:
    description:
      - Private key for the SSH backends. The ssh_paramiko backend accepts any host key
        (proxmoxer's choice); use HTTPS with O(verify_ssl) where that matters.
    type: path
  timeout:
    description: Seconds to wait for the connection and for each API call.
    type: int
    default: 10
  node:
    description: Proxmox node name that holds the container.
    type: str
    required: true
  vmid:
    description: VMID of the container.
    type: int
    required: true
  start_if_stopped:
    description:
      - Start the container when it is stopped, then wait (bounded by O(start_timeout)) for
        the start task and for the status C(running). When false, a stopped container is an
        error that names the fix.
    type: bool
    default: false
  start_timeout:
    description: Seconds to wait for a start (task and status) or a snapshot task.
    type: int
    default: 60
  gpus:
    description:
      - Indexes K of the GPUs (C(/dev/nvidiaK)) the container must have. With any GPU, the
        config must also pass C(/dev/nvidiactl) and C(/dev/nvidia-uvm) through.
    type: list
    elements: int
    default: []
  mounts:
    description: Mount points the container must have (an C(mpN) with C(mp=) that path).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Path inside the container, for example C(/mnt/wheelhouse).
        type: str
        required: true
      source:
        description: When set, the node-side source the mount point must use.
        type: str
  snapshot:
    description: Take a snapshot before the deploy. Omit for none.
    type: dict
    suboptions:
      name_prefix:
        description:
          - Snapshot names are C(<name_prefix>-<UTC YYYYmmddHHMMSS>). Only snapshots named so
            count for retention. Letters, digits, C(-) and C(_), starting with a letter, at
            most 25 characters (Proxmox allows 40 for the whole name).
        type: str
        default: dflash-predeploy
      retain:
        description:
          - How many of these snapshots to keep, the new one included; older ones are deleted.
            Must be at least 1 (0 would delete the snapshot just taken).
        type: int
        default: 3
      description:
        description: Description stored with the snapshot.
        type: str
        default: taken by dflash-deploy before a deploy
requirements:
  - proxmoxer >= 2.0
  - paramiko (ssh_paramiko backend), openssh_wrapper (openssh backend), requests (https backend)
notes:
  - Supports check mode.
attributes:
  check_mode:
    support: full
    details: Reads the container and names what it would start or snapshot; changes nothing.
author: dflash-deploy
"""

EXAMPLES = r"""
- name: The container is ready for a deploy (token from PROXMOX_TOKEN_ID/_SECRET)
  dflash_proxmox:
    api_host: pve1.example.org
    node: pve1
    vmid: "{{ proxmox_vmid }}"
    start_if_stopped: true
    gpus: [0, 1]
    mounts:
      - path: /mnt/wheelhouse
    snapshot:
      name_prefix: dflash-predeploy
      retain: 3
  delegate_to: localhost

- name: The same over SSH to the node (pvesh), as the loopback test bed does
  dflash_proxmox:
    backend: ssh_paramiko
    api_host: 127.0.0.1
    api_port: 2222
    api_user: root
    ssh_private_key_file: ~/.ssh/proxmox_root
    node: pve
    vmid: 200
  delegate_to: localhost
"""

RETURN = r"""
vmid:
  description: The container's VMID.
  type: int
  returned: always
node:
  description: The node name.
  type: str
  returned: always
status:
  description: Container status after the module ran (C(running), C(stopped)); in check mode,
    what it is now.
  type: str
  returned: success
started:
  description: Whether the module started the container (or would, in check mode).
  type: bool
  returned: success
config:
  description: >
    Summary of the container's config: C(hostname), C(arch), C(memory), C(cores),
    C(unprivileged), C(gpus) (GPU indexes passed through, with how), C(devices) (all device
    paths passed through), C(mounts) (container path -> key, source, read_only).
  type: dict
  returned: success
snapshot:
  description: >
    C(created) (name or null), C(removed) (names), C(kept) (names of this module's snapshots
    left after retention). In check mode, what would be created and removed.
  type: dict
  returned: when snapshot is set
actions:
  description: What the module did (or would do, in check mode), one line each.
  type: list
  elements: str
  returned: success
"""

import importlib.util
import re
import time
import traceback
from typing import Any

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

try:
    from proxmoxer import ProxmoxAPI, ResourceException

    PROXMOXER_ERROR = None
except ImportError:
    ProxmoxAPI = None
    ResourceException = Exception
    PROXMOXER_ERROR = traceback.format_exc()

# Python packages each proxmoxer backend imports; proxmoxer itself calls sys.exit() when they
# are missing, so they are checked first.
BACKEND_NEEDS = {"https": "requests", "ssh_paramiko": "paramiko", "openssh": "openssh_wrapper"}
NVIDIA_MAJOR = 195  # /dev/nvidiaK and /dev/nvidiactl; nvidia-uvm's major is dynamic
SNAP_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,24}$")
SNAP_STAMP = "%Y%m%d%H%M%S"


class PreflightError(Exception):
    """A failure with a message that says what was expected, what was found and the fix."""


# --- connection ---------------------------------------------------------------------------
def connect(params: dict[str, Any]) -> Any:
    backend = params["backend"]
    host, port, timeout = params["api_host"], params["api_port"], params["timeout"]
    if backend == "https":
        token_id, secret = params["api_token_id"], params["api_token_secret"]
        user = params["api_user"] or "root@pam"
        if "!" in token_id:
            user, token_id = token_id.split("!", 1)
        kwargs = {
            "user": user,
            "token_name": token_id,
            "token_value": secret,
            "verify_ssl": params["verify_ssl"],
            "timeout": timeout,
        }
        where = f"https://{host}:{port or 8006}"
    else:
        user = params["api_user"] or "root"
        kwargs = {"user": user, "port": port or 22, "timeout": timeout}
        key = params["ssh_private_key_file"]
        if key:
            kwargs["private_key_file" if backend == "ssh_paramiko" else "identity_file"] = key
        where = f"ssh {user}@{host}:{port or 22}"
    if port and backend == "https":
        kwargs["port"] = port
    try:
        api = ProxmoxAPI(host, backend=backend, **kwargs)
    except Exception as exc:
        raise PreflightError(
            f"cannot reach the Proxmox API of node {params['node']} at {where} "
            f"(backend {backend}): {exc or type(exc).__name__}"
        ) from exc
    return api


def call(what: str, func: Any, *args: Any, **kwargs: Any) -> Any:
    """One API call; an API error becomes a PreflightError that says which call failed."""
    try:
        return func(*args, **kwargs)
    except ResourceException as exc:
        detail = str(getattr(exc, "content", "") or exc).strip()
        raise PreflightError(f"{what} failed: {detail}") from exc
    except Exception as exc:  # transport errors (SSH channel, TLS, refused, timeouts)
        raise PreflightError(
            f"{what} failed: cannot reach the Proxmox API ({exc or type(exc).__name__}); check "
            "api_host/api_port and that the node is up"
        ) from exc


# --- what the container is ----------------------------------------------------------------
def find_container(api: Any, node: str, vmid: int) -> dict[str, Any]:
    try:
        containers = api.nodes(node).lxc.get()
    except ResourceException as exc:
        known = [n.get("node") for n in call("listing the cluster's nodes", api.nodes.get)]
        if node not in known:
            raise PreflightError(
                f"node {node!r} is not known to the Proxmox API (nodes: "
                f"{', '.join(map(str, known)) or 'none'}); set node to the one that holds "
                f"container {vmid}"
            ) from exc
        raise PreflightError(f"listing the containers of node {node} failed: {exc}") from exc
    except Exception as exc:  # the first call: a refused or broken connection shows here
        raise PreflightError(
            f"listing the containers of node {node} failed: cannot reach the Proxmox API "
            f"({exc}); check api_host/api_port and that the node is up"
        ) from exc
    by_id = {int(c["vmid"]): c for c in containers}
    if vmid not in by_id:
        present = ", ".join(str(v) for v in sorted(by_id)) or "none"
        raise PreflightError(
            f"container {vmid} does not exist on node {node} (containers there: {present}); "
            "check the host's proxmox_vmid and node"
        )
    return by_id[vmid]


def lxc_entries(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Raw `lxc.*` lines: the API returns them as [key, value] pairs under `lxc`."""
    raw = config.get("lxc") or []
    return [(str(k), str(v)) for k, v in raw]


def property_string(value: str, first: str) -> dict[str, str]:
    """`/src,mp=/dst,ro=1` -> {first: '/src', 'mp': '/dst', 'ro': '1'}."""
    result: dict[str, str] = {}
    for index, part in enumerate(str(value).split(",")):
        key, sep, val = part.partition("=")
        if sep:
            result[key.strip()] = val.strip()
        elif index == 0:
            result[first] = part.strip()
    return result


def passed_devices(config: dict[str, Any]) -> dict[str, str]:
    """Device path -> the config line that passes it (`devN` or `lxc.mount.entry`)."""
    devices: dict[str, str] = {}
    for key, value in config.items():
        if re.fullmatch(r"dev\d+", key):
            path = property_string(value, "path").get("path", "")
            devices[path] = f"{key}: {value}"
    for key, value in lxc_entries(config):
        if key == "lxc.mount.entry":
            source = value.split()[0] if value.split() else ""
            if source.startswith("/dev/"):
                devices.setdefault(source, f"{key}: {value}")
    return devices


def cgroup_allows(config: dict[str, Any], major: int, minor: int) -> bool:
    """Whether a `lxc.cgroup[2].devices.allow` rule lets the container use char device M:m."""
    for key, value in lxc_entries(config):
        if key not in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            continue
        match = re.fullmatch(r"([abc])\s+(\*|\d+):(\*|\d+)\s*([rwm]*)", value.strip())
        if not match or match[1] not in ("a", "c"):
            continue
        if match[2] in ("*", str(major)) and match[3] in ("*", str(minor)):
            return True
    return False


def gpu_problems(config: dict[str, Any], vmid: int, gpus: list[int]) -> list[str]:
    if not gpus:
        return []
    devices = passed_devices(config)
    wanted = [(f"/dev/nvidia{k}", f"GPU {k}", k) for k in gpus]
    wanted += [
        ("/dev/nvidiactl", "the NVIDIA control device", 255),
        ("/dev/nvidia-uvm", "the NVIDIA UVM device", None),
    ]
    problems = []
    next_dev = _next_index(config, "dev")
    for path, what, minor in wanted:
        line = devices.get(path)
        if line is None:
            problems.append(
                f"{what} ({path}) is not passed through to container {vmid}; add "
                f"'dev{next_dev}: {path}' to its config (pct set {vmid} -dev{next_dev} {path})"
            )
            next_dev += 1
        elif (
            line.startswith("lxc.")
            and minor is not None
            and not cgroup_allows(config, NVIDIA_MAJOR, minor)
        ):
            problems.append(
                f"{what} ({path}) is mounted into container {vmid} ('{line}') but no "
                f"cgroup rule allows it; add 'lxc.cgroup2.devices.allow: c "
                f"{NVIDIA_MAJOR}:* rwm' to /etc/pve/lxc/{vmid}.conf"
            )
    return problems


def mount_points(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Container path -> {key, source, read_only} for every mpN (and lxc bind mount)."""
    found: dict[str, dict[str, Any]] = {}
    for key in sorted(config):
        if re.fullmatch(r"mp\d+", key):
            mount = property_string(config[key], "volume")
            if mount.get("mp"):
                found[mount["mp"].rstrip("/") or "/"] = {
                    "key": key,
                    "source": mount.get("volume", ""),
                    "read_only": mount.get("ro") in ("1", "true", "yes", "on"),
                }
    for key, value in lxc_entries(config):
        words = value.split()
        if key == "lxc.mount.entry" and len(words) >= 4 and "bind" in words[3]:
            target = "/" + words[1].strip("/")
            found.setdefault(
                target, {"key": key, "source": words[0], "read_only": "ro" in words[3].split(",")}
            )
    return found


def mount_problems(config: dict[str, Any], vmid: int, mounts: list[dict[str, Any]]) -> list[str]:
    found = mount_points(config)
    problems = []
    next_mp = _next_index(config, "mp")
    for wanted in mounts:
        path = "/" + wanted["path"].strip("/")
        have = found.get(path)
        source = wanted.get("source")
        if have is None:
            example = source or "/path/on/node"
            problems.append(
                f"container {vmid} has no mount point at {path}; add one, e.g. "
                f"'mp{next_mp}: {example},mp={path}' (pct set {vmid} -mp{next_mp} "
                f"{example},mp={path})"
            )
            next_mp += 1
        elif source and have["source"].rstrip("/") != source.rstrip("/"):
            problems.append(
                f"mount point {path} of container {vmid} comes from {have['source']} "
                f"({have['key']}), expected {source}"
            )
    return problems


def _next_index(config: dict[str, Any], prefix: str) -> int:
    used = [int(k[len(prefix) :]) for k in config if re.fullmatch(rf"{prefix}\d+", k)]
    return max(used, default=-1) + 1


def summarize(config: dict[str, Any], gpus: list[int]) -> dict[str, Any]:
    devices = passed_devices(config)
    return {
        "hostname": config.get("hostname"),
        "arch": config.get("arch"),
        "memory": config.get("memory"),
        "cores": config.get("cores"),
        "unprivileged": bool(int(config.get("unprivileged") or 0)),
        "gpus": {
            str(k): devices[f"/dev/nvidia{k}"]
            for k in sorted({*gpus, *_gpu_indexes(devices)})
            if f"/dev/nvidia{k}" in devices
        },
        "devices": sorted(devices),
        "mounts": mount_points(config),
    }


def _gpu_indexes(devices: dict[str, str]) -> list[int]:
    return [int(m[1]) for d in devices if (m := re.fullmatch(r"/dev/nvidia(\d+)", d))]


# --- changing things ----------------------------------------------------------------------
def wait_task(api: Any, node: str, upid: str, timeout: int, what: str) -> None:
    """Bounded wait for a task to stop; it must end with exit status OK."""
    deadline = time.monotonic() + timeout
    while True:
        task = call(f"reading the task of {what}", api.nodes(node).tasks(upid).status.get)
        if task.get("status") == "stopped":
            if task.get("exitstatus") != "OK":
                raise PreflightError(
                    f"{what} failed: task {upid} ended with {task.get('exitstatus')!r}"
                )
            return
        if time.monotonic() >= deadline:
            raise PreflightError(f"{what}: task {upid} still running after {timeout} s")
        time.sleep(0.5)


def start_container(api: Any, node: str, vmid: int, timeout: int) -> str:
    ct = api.nodes(node).lxc(vmid)
    upid = call(f"starting container {vmid}", ct.status.start.post)
    began = time.monotonic()
    wait_task(api, node, str(upid), timeout, f"starting container {vmid}")
    status = "unknown"
    while time.monotonic() - began < timeout:
        status = call(f"reading the status of container {vmid}", ct.status.current.get)["status"]
        if status == "running":
            return status
        time.sleep(0.5)
    raise PreflightError(
        f"container {vmid} did not reach status 'running' within {timeout} s after its start "
        f"task (status: {status}); see its log on node {node} (pct start {vmid} --debug)"
    )


def snapshot_plan(
    snapshots: list[dict[str, Any]], prefix: str, retain: int, now: float
) -> tuple[str, list[str], list[str]]:
    """(name to create, names to delete after it, names kept) for this module's snapshots."""
    ours_re = re.compile(rf"^{re.escape(prefix)}-\d{{14}}(?:-\d+)?$")
    ours = sorted(
        (s for s in snapshots if s.get("name") != "current" and ours_re.match(str(s["name"]))),
        key=lambda s: (int(s.get("snaptime") or 0), str(s["name"])),
    )
    taken = {str(s["name"]) for s in snapshots}
    name = f"{prefix}-{time.strftime(SNAP_STAMP, time.gmtime(now))}"
    suffix = 2
    while name in taken:  # two deploys within one second
        name = f"{prefix}-{time.strftime(SNAP_STAMP, time.gmtime(now))}-{suffix}"
        suffix += 1
    order = [str(s["name"]) for s in ours] + [name]
    remove = order[: max(0, len(order) - retain)]
    return name, remove, [n for n in order if n not in remove]


def take_snapshot(
    api: Any,
    node: str,
    vmid: int,
    spec: dict[str, Any],
    timeout: int,
    result: dict[str, Any],
    check_mode: bool,
) -> None:
    """Snapshot, then retention; `result` records each step as it completes."""
    ct = api.nodes(node).lxc(vmid)
    existing = call(f"listing the snapshots of container {vmid}", ct.snapshot.get)
    name, remove, kept = snapshot_plan(existing, spec["name_prefix"], spec["retain"], time.time())
    done: dict[str, Any] = {"created": None, "removed": [], "kept": kept}
    result["snapshot"] = done
    if check_mode:
        done.update(created=name, removed=remove)
        result["actions"].append(f"would take snapshot {name}")
        result["actions"] += [f"would delete snapshot {old} (retention)" for old in remove]
        return
    upid = call(
        f"snapshot {name} of container {vmid}",
        ct.snapshot.post,
        snapname=name,
        description=spec["description"],
    )
    wait_task(api, node, str(upid), timeout, f"snapshot {name} of container {vmid}")
    done["created"] = name
    result["actions"].append(f"took snapshot {name}")
    for old in remove:
        upid = call(f"deleting snapshot {old} of container {vmid}", ct.snapshot(old).delete)
        wait_task(api, node, str(upid), timeout, f"deleting snapshot {old}")
        done["removed"].append(old)
        result["actions"].append(f"deleted snapshot {old} (retention)")


# --- the module ---------------------------------------------------------------------------
def validate(params: dict[str, Any]) -> None:
    """Input errors, found before any call: nothing is changed when one is found."""
    spec = params["snapshot"]
    if spec is not None:
        if spec["retain"] < 1:
            raise PreflightError(
                f"snapshot.retain is {spec['retain']}: it must be at least 1, or the snapshot "
                "just taken would be deleted at once (omit snapshot to take none); nothing was "
                "changed"
            )
        if not SNAP_PREFIX.match(spec["name_prefix"]):
            raise PreflightError(
                f"snapshot.name_prefix {spec['name_prefix']!r} is not usable in a Proxmox "
                "snapshot name: letters, digits, '-' and '_', starting with a letter, at most "
                "25 characters; nothing was changed"
            )
    for gpu in params["gpus"]:
        if gpu < 0:
            raise PreflightError(f"gpus: {gpu} is not a GPU index (0, 1, ...)")
    if params["start_timeout"] < 1 or params["timeout"] < 1:
        raise PreflightError("start_timeout and timeout must be at least 1 second")
    if params["backend"] == "https" and not (params["api_token_id"] and params["api_token_secret"]):
        raise PreflightError(
            "the https backend needs an API token: set api_token_id and api_token_secret "
            "(or PROXMOX_TOKEN_ID and PROXMOX_TOKEN_SECRET in the environment)"
        )


def preflight(params: dict[str, Any], result: dict[str, Any], check_mode: bool) -> None:
    """All checks first, then the changes; `result` holds what was done so far."""
    node, vmid = params["node"], params["vmid"]
    api = connect(params)
    find_container(api, node, vmid)
    ct = api.nodes(node).lxc(vmid)
    config = call(f"reading the config of container {vmid}", ct.config.get)
    status = call(f"reading the status of container {vmid}", ct.status.current.get)["status"]
    result["status"] = status
    result["config"] = summarize(config, params["gpus"])
    problems = gpu_problems(config, vmid, params["gpus"])
    problems += mount_problems(config, vmid, params["mounts"])
    if status != "running" and not params["start_if_stopped"]:
        problems.append(
            f"container {vmid} on node {node} is {status}; start it (pct start {vmid}) or set "
            "start_if_stopped: true"
        )
    if problems:
        count = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
        raise PreflightError(
            f"container {vmid} on node {node} is not ready ({count}): " + "; ".join(problems)
        )
    if status != "running":
        result["started"] = True
        if check_mode:
            result["actions"].append(f"would start container {vmid} (it is {status})")
        else:
            result["status"] = start_container(api, node, vmid, params["start_timeout"])
            result["actions"].append(f"started container {vmid} (it was {status})")
    if params["snapshot"] is not None:
        take_snapshot(
            api, node, vmid, params["snapshot"], params["start_timeout"], result, check_mode
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "api_host": {"type": "str", "required": True},
            "api_port": {"type": "int"},
            "backend": {
                "type": "str",
                "default": "https",
                "choices": ["https", "ssh_paramiko", "openssh"],
            },
            "api_user": {"type": "str"},
            "api_token_id": {
                "type": "str",
                "no_log": False,
                "fallback": (env_fallback, ["PROXMOX_TOKEN_ID"]),
            },
            "api_token_secret": {
                "type": "str",
                "no_log": True,
                "fallback": (env_fallback, ["PROXMOX_TOKEN_SECRET"]),
            },
            "verify_ssl": {"type": "bool", "default": True},
            "ssh_private_key_file": {"type": "path"},
            "timeout": {"type": "int", "default": 10},
            "node": {"type": "str", "required": True},
            "vmid": {"type": "int", "required": True},
            "start_if_stopped": {"type": "bool", "default": False},
            "start_timeout": {"type": "int", "default": 60},
            "gpus": {"type": "list", "elements": "int", "default": []},
            "mounts": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "str", "required": True},
                    "source": {"type": "str"},
                },
            },
            "snapshot": {
                "type": "dict",
                "options": {
                    "name_prefix": {"type": "str", "default": "dflash-predeploy"},
                    "retain": {"type": "int", "default": 3},
                    "description": {
                        "type": "str",
                        "default": "taken by dflash-deploy before a deploy",
                    },
                },
            },
        },
        supports_check_mode=True,
    )
    params = module.params
    result: dict[str, Any] = {
        "vmid": params["vmid"],
        "node": params["node"],
        "started": False,
        "actions": [],
    }
    try:
        validate(params)  # input errors first: they are the user's to fix, whatever is installed
    except PreflightError as exc:
        module.fail_json(msg=str(exc), changed=False, **result)
    if PROXMOXER_ERROR is not None:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_ERROR, **result)
    needed = BACKEND_NEEDS[params["backend"]]
    if importlib.util.find_spec(needed) is None:
        reason = f"the {params['backend']} backend"
        module.fail_json(msg=missing_required_lib(needed, reason=reason), **result)
    try:
        preflight(params, result, module.check_mode)
    except PreflightError as exc:
        # changed tells the truth also on failure: a start or snapshot may have happened
        result["changed"] = bool(result["actions"]) and not module.check_mode
        module.fail_json(msg=str(exc), **result)
    result["changed"] = bool(result["actions"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
