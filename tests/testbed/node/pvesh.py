"""`pvesh` test double: the API paths the deploy tooling calls, answered from the node's configs.

Contract of proxmoxer's SSH backends (they ignore the exit code): `pvesh get|create|set|delete
PATH [-key value]... --output-format json` prints the bare JSON result on stdout with an empty
stderr; an error is text on stderr (`400 Parameter verification failed.` style lines carry the
HTTP code, plain `die` messages do not and read as 500). Task calls return a UPID string.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from urllib.parse import unquote

from . import trace
from .cli import split_options
from .nodecfg import NodeConfig
from .ops import Node, PveError
from .tasks import list_tasks, read_task

Handler = Callable[[Node, dict[str, str], dict[str, list[str]]], object]
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = []


def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    regex = re.compile(
        "^" + re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>[^/]+)", pattern) + "/?$"
    )

    def register(func: Handler) -> Handler:
        ROUTES.append((method, regex, func))
        return func

    return register


def _vmid(params: dict[str, str]) -> int:
    value = params["vmid"]
    if not value.isdigit():
        raise PveError.param("vmid", f"type check ('integer') failed - got '{value}'")
    return int(value)


def _opt(options: dict[str, list[str]], key: str, default: str | None = None) -> str | None:
    return options.get(key, [default])[-1]


@route("get", "/version")
def _version(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return {"version": "8.2.4", "release": "8.2", "repoid": "faa83925c9641325"}


@route("get", "/nodes")
def _nodes(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return [
        {"node": node.cfg.node, "status": "online", "type": "node", "id": f"node/{node.cfg.node}"}
    ]


@route("get", "/nodes/{node}/lxc")
def _lxc_list(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.list()


@route("get", "/nodes/{node}/lxc/{vmid}")
def _lxc_dir(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    node.load(_vmid(params))
    return [{"subdir": name} for name in ("config", "status", "snapshot", "pending")]


@route("get", "/nodes/{node}/lxc/{vmid}/status/current")
def _status(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.status(_vmid(params))


@route("post", "/nodes/{node}/lxc/{vmid}/status/start")
def _start(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.start(_vmid(params))


@route("post", "/nodes/{node}/lxc/{vmid}/status/stop")
def _stop(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.stop(_vmid(params))


@route("post", "/nodes/{node}/lxc/{vmid}/status/shutdown")
def _shutdown(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.stop(_vmid(params), int(_opt(options, "timeout", "60") or 60))


@route("get", "/nodes/{node}/lxc/{vmid}/config")
def _config(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.config(_vmid(params), _opt(options, "snapshot"))


@route("put", "/nodes/{node}/lxc/{vmid}/config")
def _set_config(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    delete = [k for v in options.pop("delete", []) for k in re.split(r"[,; ]+", v) if k]
    options.pop("digest", None)
    node.set_config(_vmid(params), {k: v[-1] for k, v in options.items()}, delete)
    return None


@route("get", "/nodes/{node}/lxc/{vmid}/snapshot")
def _snapshots(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.snapshots(_vmid(params))


@route("post", "/nodes/{node}/lxc/{vmid}/snapshot")
def _snapshot(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    name = _opt(options, "snapname")
    if not name:
        raise PveError.param("snapname", "property is missing and it is not optional")
    return node.snapshot(_vmid(params), name, _opt(options, "description", "") or "")


@route("get", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}/config")
def _snapshot_config(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.config(_vmid(params), params["snapname"])


@route("delete", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}")
def _delsnapshot(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return node.delete_snapshot(_vmid(params), params["snapname"])


@route("get", "/nodes/{node}/tasks")
def _tasks(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    return [{k: v for k, v in t.items() if k != "log"} for t in list_tasks(node.cfg)]


@route("get", "/nodes/{node}/tasks/{upid}/status")
def _task_status(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    task = _task(node, params["upid"])
    return {k: v for k, v in task.items() if k != "log"}


@route("get", "/nodes/{node}/tasks/{upid}/log")
def _task_log(node: Node, params: dict[str, str], options: dict[str, list[str]]) -> object:
    lines = _task(node, params["upid"]).get("log", [])
    return [{"n": n, "t": text} for n, text in enumerate(lines, start=1)]  # type: ignore[arg-type]


def _task(node: Node, upid: str) -> dict[str, object]:
    upid = unquote(upid)
    if not upid.startswith("UPID:") or len(upid.split(":")) != 9:
        raise PveError.param("upid", f"unable to parse worker upid '{upid}'")
    task = read_task(node.cfg, upid)
    if task is None:
        raise PveError("no such task")
    return task


def _format(data: object, fmt: str) -> str:
    if data is None:
        return ""  # methods that return null print nothing
    if fmt == "json":
        return json.dumps(data, sort_keys=True) + "\n"
    # json-pretty, and (simplified) the text table formats
    return json.dumps(data, sort_keys=True, indent=4) + "\n"


def dispatch(node: Node, argv: list[str]) -> tuple[str, str, int]:
    """(stdout, stderr, exit code) for one pvesh command line."""
    if not argv or argv[0] not in ("get", "set", "create", "delete"):
        return "", "USAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n", 255
    cmd = argv[0]
    positional, options = split_options(argv[1:])
    if not positional:
        return "", "400 not enough arguments\npvesh get <api_path> [OPTIONS]\n", 255
    path = "/" + positional[0].strip("/")
    fmt = _opt(options, "output-format", "text") or "text"
    options.pop("output-format", None)
    options.pop("noproxy", None)
    method = {"create": "post", "set": "put"}.get(cmd, cmd)
    for route_method, regex, handler in ROUTES:
        match = regex.match(path)
        if route_method != method or not match:
            continue
        params = match.groupdict()
        other = params.get("node")
        if other is not None and other != node.cfg.node:
            # Proxmox would proxy to that node and fails to resolve it
            message = (f"hostname lookup '{other}' failed - failed to get address info for: "
                       f"{other}: Name or service not known")  # fmt: skip
            return "", message + "\n", 255
        try:
            return _format(handler(node, params, options), fmt), "", 0
        except PveError as exc:
            return "", str(exc).rstrip("\n") + "\n", exc.exit_code
    return "", f"No '{cmd}' handler defined for '{path}'\n", 1


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
