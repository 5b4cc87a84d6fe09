"""`pvesh` test double: the API paths of routes.py, as root@pam on the node.

Contract of proxmoxer's SSH backends (they ignore the exit code): `pvesh get|create|set|delete
PATH [-key value]... --output-format json` prints the bare JSON result on stdout with an empty
stderr; an error is text on stderr (`400 Parameter verification failed.` style lines carry the
HTTP code, plain `die` messages do not and read as 500). Task calls run the worker in the
foreground (the CLI environment's `fork_worker`) and print its UPID.
"""

from __future__ import annotations

import json
import re
import sys

from . import trace
from .cli import split_options
from .nodecfg import NodeConfig
from .ops import Node, PveError, Task
from .routes import Paged, Request, find, handle
from .tasks import run


def _format(data: object, fmt: str) -> str:
    if isinstance(data, Paged):
        data = data.data
    if data is None:
        return ""  # methods that return null print nothing
    if fmt == "json":
        return json.dumps(data, sort_keys=True) + "\n"
    # json-pretty, and (simplified) the text table formats
    return json.dumps(data, sort_keys=True, indent=4) + "\n"


def _run_here(node: Node) -> object:
    def run_task(task: Task, user: str) -> str:
        upid, _ = run(node.cfg, task.kind, task.ident, user, lambda log: node.run(task, log))
        return upid

    return run_task


def dispatch(node: Node, argv: list[str]) -> tuple[str, str, int]:
    """(stdout, stderr, exit code) for one pvesh command line."""
    if not argv or argv[0] not in ("get", "set", "create", "delete"):
        return "", "USAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n", 255
    cmd = argv[0]
    positional, options = split_options(argv[1:])
    if not positional:
        return "", "400 not enough arguments\npvesh get <api_path> [OPTIONS]\n", 255
    path = "/" + positional[0].strip("/")
    fmt = (options.pop("output-format", None) or ["text"])[-1]
    options.pop("noproxy", None)
    method = {"create": "post", "set": "put"}.get(cmd, cmd)
    found = find(method, path)
    if found is None:
        return "", f"No '{cmd}' handler defined for '{path}'\n", 1
    route, params = found
    req = Request(node, params, options, run_task=_run_here(node))  # type: ignore[arg-type]
    try:
        return _format(handle(req, route), fmt), "", 0
    except PveError as exc:
        return "", str(exc).rstrip("\n") + "\n", exc.exit_code


def main() -> None:
    argv = sys.argv[1:]
    node = Node(NodeConfig.load())
    path = argv[1] if len(argv) > 1 else None
    vmid = re.search(r"/lxc/(\d+)", path or "")
    trace.record(node.cfg, "pvesh", argv, argv[0] if argv else "", vmid and vmid[1], path)
    out, err, code = dispatch(node, argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
