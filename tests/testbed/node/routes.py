"""The API paths the doubles answer, shared by `pvesh` (as root@pam, tasks in the foreground) and
the HTTPS API (as the token's user, tasks forked), with the permission check Proxmox declares
for each (`permissions => {check => ['perm', PATH, PRIVS]}` in the handler, checked before the
handler runs: pve-manager PVE/HTTPServer.pm `rest_handler` -> `check_api2_permissions`).

Handlers, by source: pve-container src/PVE/API2/LXC.pm (`vmlist`, `vm_feature`, `vm_pending`,
`ip`), API2/LXC/Status.pm (`vm_status`, `vm_start`, `vm_stop`, `vm_shutdown`),
API2/LXC/Config.pm (`vm_config`, `update_vm`), API2/LXC/Snapshot.pm (`list`, `snapshot`,
`delsnapshot`, `get_snapshot_config`); pve-manager PVE/API2/Tasks.pm (`node_tasks`,
`read_task_status`, `read_task_log`), PVE/API2/Cluster.pm (`resources`), PVE/API2/Nodes.pm
(`index`), PVE/API2/Pool.pm (`index`), PVE/API2.pm (`version`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import unquote

from . import tasks
from .access import ROLES, UserConfig, check
from .ops import Node, PveError, Task

ROOT = "root@pam"
VM_CONFIG_PRIVS = ["VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
                   "VM.Config.Options"]  # fmt: skip


@dataclass
class Request:
    node: Node
    params: dict[str, str]  # from the path
    options: dict[str, list[str]]  # query or body parameters (repeatable)
    user: str = ROOT
    access: UserConfig | None = None  # None: pvesh on the node, as root@pam
    run_task: Callable[[Task, str], str] = field(default=lambda task, user: "")

    def opt(self, key: str, default: str | None = None) -> str | None:
        return self.options.get(key, [default])[-1]

    def flag(self, key: str) -> bool:
        return (self.opt(key, "0") or "0").lower() in ("1", "true", "yes", "on")

    def denied(self, path: str, privs: list[str], any_of: bool = False) -> str:
        """'' when the user has the privileges, else Proxmox's 403 text."""
        if self.access is None or self.user == ROOT:
            return ""
        return check(self.access, self.user, path, privs, any_of)

    def vmid(self) -> int:
        value = self.params["vmid"]
        if not value.isdigit():
            raise PveError.param("vmid", f"type check ('integer') failed - got '{value}'")
        return int(value)

    def task(self, task: Task) -> str:
        return self.run_task(task, self.user)


@dataclass
class Paged:
    """A list with the `total` result attribute (`$rpcenv->set_result_attrib('total', ...)`)."""

    data: list[dict[str, object]]
    total: int


Handler = Callable[[Request], object]


@dataclass(frozen=True)
class Route:
    method: str
    regex: re.Pattern[str]
    handler: Handler
    perm: tuple[str, list[str], bool] | None  # (path template, privileges, any of them)


ROUTES: list[Route] = []


def route(method: str, pattern: str, perm: tuple[str, list[str]] | None = None,
          any_of: bool = False) -> Callable[[Handler], Handler]:  # fmt: skip
    regex = re.compile(
        "^" + re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>[^/]+)", pattern) + "/?$"
    )

    def register(func: Handler) -> Handler:
        ROUTES.append(Route(method, regex, func, (perm[0], perm[1], any_of) if perm else None))
        return func

    return register


def find(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    for candidate in ROUTES:
        match = candidate.regex.match(path)
        if candidate.method == method and match:
            return candidate, {k: unquote(v) for k, v in match.groupdict().items()}
    return None


def handle(req: Request, found: Route) -> object:
    """Permission check, then the node check, then the call. A read for another node of the
    cluster is answered as that node would (pveproxy proxies it there); the bed runs no second
    node to change anything on, so other calls for one fail as for a node out of reach."""
    if found.perm is not None:
        template, privs, any_of = found.perm
        path = re.sub(r"\{(\w+)\}", lambda m: req.params[m.group(1)], template)
        if message := req.denied(path, privs, any_of):
            raise PveError(message, code=403)
    other = req.params.get("node")
    peer = req.node.peer(other) if other is not None else None
    if peer is not None and found.method == "get":
        req = replace(req, node=peer)
    elif other is not None and other != req.node.cfg.node:
        raise PveError(f"hostname lookup '{other}' failed - failed to get address info for: "
                       f"{other}: Name or service not known")  # fmt: skip
    return found.handler(req)


AUDIT = ("/vms/{vmid}", ["VM.Audit"])
POWER = ("/vms/{vmid}", ["VM.PowerMgmt"])
SNAPSHOT = ("/vms/{vmid}", ["VM.Snapshot"])


@route("get", "/version")
def _version(req: Request) -> object:
    return {"version": "8.2.4", "release": "8.2", "repoid": "faa83925c9641325"}


@route("get", "/nodes")
def _nodes(req: Request) -> object:
    return [{"node": name, "status": "online", "type": "node", "id": f"node/{name}"}
            for name in req.node.cluster_nodes()]  # fmt: skip


def _visible(req: Request) -> list[dict[str, object]]:
    """Containers this user may audit: the others are left out, not refused."""
    return [c for c in req.node.list() if not req.denied(f"/vms/{c['vmid']}", ["VM.Audit"])]


@route("get", "/cluster/resources")
def _resources(req: Request) -> object:
    kind = req.opt("type")
    if kind not in (None, "vm"):
        return []
    here = [{**c, "node": req.node.cfg.node} for c in _visible(req)]
    there = [c for c in req.node.elsewhere() if not req.denied(f"/vms/{c['vmid']}", ["VM.Audit"])]
    return [{**c, "id": f"lxc/{c['vmid']}", "maxdisk": 8 << 30} for c in here + there]


@route("get", "/pools")
def _pools(req: Request) -> object:
    return []


@route("get", "/nodes/{node}/lxc")
def _lxc_list(req: Request) -> object:
    return _visible(req)


@route("get", "/nodes/{node}/qemu")
def _qemu_list(req: Request) -> object:
    return []


@route("get", "/nodes/{node}/lxc/{vmid}", AUDIT)
def _lxc_dir(req: Request) -> object:
    req.node.load(req.vmid())
    names = ("config", "status", "snapshot", "pending", "feature", "interfaces")
    return [{"subdir": name} for name in names]


@route("get", "/nodes/{node}/lxc/{vmid}/status/current", AUDIT)
def _status(req: Request) -> object:
    return req.node.status(req.vmid())


@route("post", "/nodes/{node}/lxc/{vmid}/status/start", POWER)
def _start(req: Request) -> object:
    return req.task(req.node.start(req.vmid()))


@route("post", "/nodes/{node}/lxc/{vmid}/status/stop", POWER)
def _stop(req: Request) -> object:
    return req.task(req.node.stop(req.vmid()))


@route("post", "/nodes/{node}/lxc/{vmid}/status/shutdown", POWER)
def _shutdown(req: Request) -> object:
    return req.task(req.node.stop(req.vmid(), int(req.opt("timeout", "60") or 60)))


@route("get", "/nodes/{node}/lxc/{vmid}/config", AUDIT)
def _config(req: Request) -> object:
    return req.node.config(req.vmid(), req.opt("snapshot"), req.flag("current"))


@route("put", "/nodes/{node}/lxc/{vmid}/config", ("/vms/{vmid}", VM_CONFIG_PRIVS), any_of=True)
def _set_config(req: Request) -> object:
    options = dict(req.options)
    delete = [k for v in options.pop("delete", []) for k in re.split(r"[,; ]+", v) if k]
    options.pop("digest", None)
    req.node.set_config(req.vmid(), {k: v[-1] for k, v in options.items()}, delete)
    return None


@route("get", "/nodes/{node}/lxc/{vmid}/pending", AUDIT)
def _pending(req: Request) -> object:
    return req.node.pending(req.vmid())


@route("get", "/nodes/{node}/lxc/{vmid}/feature", AUDIT)
def _feature(req: Request) -> object:
    feature = req.opt("feature")
    if not feature:
        raise PveError.param("feature", "property is missing and it is not optional")
    return req.node.feature(req.vmid(), feature, req.opt("snapname"))


@route("get", "/nodes/{node}/lxc/{vmid}/interfaces", AUDIT)
def _interfaces(req: Request) -> object:
    vmid = req.vmid()
    if not req.node.running(vmid):
        raise PveError(f"CT {vmid} not running")
    # The bed's containers share the node's network (lxc.net.0.type = none) or have none:
    # their own interface is loopback.
    return [{"name": "lo", "hwaddr": "00:00:00:00:00:00", "inet": "127.0.0.1/8",
             "inet6": "::1/128"}]  # fmt: skip


@route("get", "/nodes/{node}/lxc/{vmid}/snapshot", AUDIT)
def _snapshots(req: Request) -> object:
    return req.node.snapshots(req.vmid())


@route("post", "/nodes/{node}/lxc/{vmid}/snapshot", SNAPSHOT)
def _snapshot(req: Request) -> object:
    name = req.opt("snapname")
    if not name:
        raise PveError.param("snapname", "property is missing and it is not optional")
    return req.task(req.node.snapshot(req.vmid(), name, req.opt("description", "") or ""))


SNAPSHOT_READ = ("/vms/{vmid}", ["VM.Snapshot", "VM.Snapshot.Rollback", "VM.Audit"])


@route("get", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}/config", SNAPSHOT_READ, any_of=True)
def _snapshot_config(req: Request) -> object:
    return req.node.config(req.vmid(), req.params["snapname"])


@route("delete", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}", SNAPSHOT)
def _delsnapshot(req: Request) -> object:
    return req.task(req.node.delete_snapshot(req.vmid(), req.params["snapname"]))


def _owner(task: dict[str, object], user: str) -> bool:
    """Tasks.pm `$check_task_user`: a token sees its own tasks, a user also its tokens'."""
    if task.get("tokenid"):
        return user in (f"{task['user']}!{task['tokenid']}", task["user"])
    return user == task["user"]


def _task(req: Request) -> dict[str, object]:
    upid = req.params["upid"]
    if tasks.upid_decode(upid) is None:
        raise PveError.param("upid", "unable to parse worker upid")
    task = tasks.status(req.node.cfg, upid)
    if task is None:
        raise PveError.param("upid", "no such task")
    node_path = f"/nodes/{req.node.cfg.node}"
    if not _owner(task, req.user) and (message := req.denied(node_path, ["Sys.Audit"])):
        raise PveError(message, code=403)
    return task


@route("get", "/nodes/{node}/tasks")
def _tasks(req: Request) -> object:
    found = []
    for path in sorted(req.node.cfg.tasks.glob("*/UPID:*")):
        task = tasks.status(req.node.cfg, path.name)
        audit = not req.denied(f"/nodes/{req.node.cfg.node}", ["Sys.Audit"])
        if task is not None and (audit or _owner(task, req.user)):
            found.append(task)
    return sorted(found, key=lambda t: -int(t["starttime"]))  # type: ignore[call-overload]


@route("get", "/nodes/{node}/tasks/{upid}/status")
def _task_status(req: Request) -> object:
    return _task(req)


@route("get", "/nodes/{node}/tasks/{upid}/log")
def _task_log(req: Request) -> object:
    _task(req)
    start = int(req.opt("start", "0") or 0)
    limit = int(req.opt("limit", "50") or 50)
    total, lines = tasks.log_lines(req.node.cfg, req.params["upid"], start, limit)
    return Paged(lines, total)


@route("get", "/access/permissions")
def _permissions(req: Request) -> object:
    """pve-access-control src/PVE/API2/AccessControl.pm `permissions`: one's own privileges
    (privilege -> propagate flag; the bed reports 1)."""
    userid = req.opt("userid") or req.user
    owned = userid == req.user or userid.split("!")[0] == req.user
    if not owned and (message := req.denied("/access", ["Sys.Audit"])):
        raise PveError(message, code=403)
    path = req.opt("path")
    if req.access is None:
        privs = set(ROLES["Administrator"])
    else:
        privs = req.access.permissions(userid, path or "/")
    return {path or "/": dict.fromkeys(sorted(privs), 1)}
