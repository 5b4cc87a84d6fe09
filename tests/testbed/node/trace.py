"""Append one JSON line per double invocation, so tests can count round trips per container."""

from __future__ import annotations

import json
import os
import time

from .nodecfg import NodeConfig


def record(
    node: NodeConfig,
    tool: str,
    argv: list[str],
    subcommand: str,
    vmid: str | None,
    path: str | None = None,
) -> None:
    entry = {
        "time": round(time.time(), 6),
        "tool": tool,
        "subcommand": subcommand,
        "vmid": vmid,
        "path": path,
        "argv": [arg if len(arg) <= 300 else arg[:300] + "..." for arg in argv],
        "pid": os.getpid(),
        # Which SSH connection ran it (client address and port): tests count connections.
        "ssh": os.environ.get("SSH_CONNECTION"),
    }
    line = (json.dumps(entry) + "\n").encode()
    # One write() on an O_APPEND file: parallel forks never interleave inside a line.
    fd = os.open(node.trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
