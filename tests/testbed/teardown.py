"""Tear a bed down by what it recorded: containers first, then sshd and anything left in the
node's mount namespace, then its folder. Used by Testbed.down, the CLI and stale-bed reaping."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import procs, registry
from .node import lxcctl
from .node.nodecfg import ENV_VAR, NodeConfig
from .procs import ProcRef


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root)
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4]
        if target == prefix or target.startswith(prefix + "/"):
            targets.append(target)
    return targets


def teardown(
    name: str,
    root: Path,
    vmids: list[int],
    node: str,
    servers: list[ProcRef],
    log: Callable[[str], None],
) -> None:
    """Stop the containers, then the servers (sshd, the namespace holder, and the HTTPS API)
    and task workers still running, then remove the bed's folder."""
    began = time.monotonic()
    cfg = NodeConfig(node=node, root=str(root), base_rootfs="")
    problems: list[str] = []
    lxc_dirs = {int(p.name) for p in cfg.lxcpath.glob("*") if p.name.isdigit()}
    for vmid in sorted(set(vmids) | lxc_dirs):
        state, pid = lxcctl.info(cfg, vmid)
        if state != "running":
            continue
        try:
            lxcctl.stop(cfg, vmid)
        except (lxcctl.LxcError, subprocess.TimeoutExpired) as exc:
            problems.append(f"CT {vmid}: {exc}")
        if pid and lxcctl.info(cfg, vmid)[0] == "running":
            # lxc-stop failed: end the container's init by its pid
            ref = procs.start_time(pid)
            if ref is not None and not procs.stop(ProcRef(pid, ref, f"CT {vmid} init")):
                problems.append(f"CT {vmid} init (pid {pid}) did not stop")
    for folder in lxcctl.cgroup_folders(root):
        try:
            folder.rmdir()
        except OSError as exc:
            problems.append(f"cgroup {folder}: {exc.strerror}")
    sshd = next((s for s in servers if s.what.startswith("sshd")), None)
    namespace = procs.mount_namespace(sshd.pid) if sshd is not None and sshd.alive() else None
    for server in servers:
        if not procs.stop(server):
            problems.append(f"{server.what} (pid {server.pid}) did not stop")
    # task workers the API forked (their environment names this bed's node.json)
    for worker in procs.pids_with_env(ENV_VAR, str(root / "node.json")):
        if not procs.stop(worker, grace_s=1.0):
            problems.append(f"task worker pid {worker.pid} did not stop")
    if namespace is not None:
        # sessions still running in the node's namespace keep its overlays alive: end them
        for left in procs.pids_in_mount_namespace(namespace):
            if not procs.stop(left, grace_s=1.0):
                problems.append(f"pid {left.pid} in the node namespace did not stop")
    for target in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], check=False, capture_output=True)
    if _mounts_under(root):
        problems.append(f"mounts remain under {root}; folder kept")
    elif root.name.startswith("dflash-testbed-"):  # never delete a folder we did not create
        shutil.rmtree(root, ignore_errors=True)
    registry.remove(name)
    if problems:
        log("testbed: teardown problems: " + "; ".join(problems))
    log(f"testbed: {name} down in {time.monotonic() - began:.1f} s")


def teardown_state(state: dict[str, Any], log: Callable[[str], None]) -> None:
    servers = [ProcRef.from_json(state[key]) for key in ("sshd", "api") if state.get(key)]
    teardown(state["name"], Path(state["root"]), [int(v) for v in state["vmids"]],
             state["node"], servers, log)  # fmt: skip


def reap_stale(log: Callable[[str], None]) -> None:
    """Tear down beds whose owning pytest process no longer exists (it was killed)."""
    for state in registry.load_all().values():
        owner = ProcRef.from_json(state["owner"]) if state.get("owner") else None
        if owner is not None and not owner.alive():
            log(f"testbed: removing stale bed {state['name']} (owner pid {owner.pid} is gone)")
            teardown_state(state, log)
