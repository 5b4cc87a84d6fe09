"""Proxmox tasks (UPIDs) for the doubles.

The CLI runs a worker in the foreground (as Proxmox's CLI environment does), so a task has
finished when the UPID is printed; its record says how it ended, like `/tasks/{upid}/status`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from .nodecfg import NodeConfig


def _pstart(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def new_upid(node: str, kind: str, ident: str, user: str = "root@pam") -> str:
    pid = os.getpid()
    return f"UPID:{node}:{pid:08X}:{_pstart(pid):08X}:{int(time.time()):08X}:{kind}:{ident}:{user}:"


def _record_path(node: NodeConfig, upid: str) -> Path:
    return node.tasks / (hashlib.sha1(upid.encode()).hexdigest() + ".json")


def run_task(node: NodeConfig, kind: str, ident: str, work: Callable[[], None]) -> str:
    """Run `work` as task `kind`; record 'OK' or the error text as its exit status."""
    upid = new_upid(node.node, kind, ident)
    fields = upid.split(":")
    record: dict[str, object] = {
        "upid": upid, "node": node.node, "pid": int(fields[2], 16), "pstart": int(fields[3], 16),
        "starttime": int(fields[4], 16), "type": kind, "id": ident, "user": "root@pam",
        "status": "running",
    }  # fmt: skip
    node.tasks.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    try:
        work()
        record["exitstatus"] = "OK"
        log.append("TASK OK")
    except Exception as exc:
        message = str(exc).strip() or type(exc).__name__
        log += message.splitlines()
        record["exitstatus"] = message.splitlines()[-1]
        log.append(f"TASK ERROR: {record['exitstatus']}")
    record.update(status="stopped", endtime=int(time.time()), log=log)
    _record_path(node, upid).write_text(json.dumps(record))
    return upid


def read_task(node: NodeConfig, upid: str) -> dict[str, object] | None:
    try:
        return json.loads(_record_path(node, upid).read_text())
    except FileNotFoundError:
        return None


def list_tasks(node: NodeConfig) -> list[dict[str, object]]:
    records = [json.loads(p.read_text()) for p in node.tasks.glob("*.json")]
    return sorted(records, key=lambda r: r["starttime"], reverse=True)  # type: ignore[arg-type,return-value]
