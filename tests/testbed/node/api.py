"""The node's HTTPS API double (pveproxy on port 8006): `python -m tests.testbed.node.api`.

The same paths and state as `pvesh` (routes.py), the way the real API serves them:
- TLS with the node's certificate (`/etc/pve/nodes/<node>/pve-ssl.pem`, signed by the cluster CA
  `/etc/pve/pve-root-ca.pem`, which the tests trust);
- authentication by API token, `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`
  (pve-http-server src/PVE/APIServer/AnyEvent.pm `unshift_read_header` ->
  `Formatter.pm extract_auth_value`; pve-manager PVE/HTTPServer.pm `auth_handler`): a missing or
  wrong token is `401 No ticket` / `401 Authentication failed!`, delayed by 3 s as the real
  server delays every unauthorized call;
- `/api2/json/...` answers `{"data": ...}` (plus `total` for paged lists); an error puts its
  first line in the HTTP reason phrase and the body is `{"data": null, "message": ...}` with
  `errors` {param: text} for a parameter error (Formatter/Standard.pm `prepare_response_data`,
  AnyEvent.pm `response`); 403 `Permission check failed (PATH, PRIV)`; an unknown path is
  `501 Method 'GET /path' not implemented` (HTTPServer.pm `rest_handler`);
- tasks are forked workers: a POST returns the UPID at once (tasks.py).
Every call is appended to the node's trace (tool `api`), as the pct/pvesh calls are.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from . import trace
from .access import AuthError, UserConfig
from .nodecfg import NodeConfig
from .ops import Node, PveError, Task
from .routes import Paged, Request, find, handle
from .tasks import spawn

UNAUTHORIZED_DELAY_S = 3.0


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"
    node: Node  # set on the class by serve()

    def do_GET(self) -> None:
        self._serve("get")

    def do_POST(self) -> None:
        self._serve("post")

    def do_PUT(self) -> None:
        self._serve("put")

    def do_DELETE(self) -> None:
        self._serve("delete")

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("api: " + (format % args) + "\n")

    def _params(self, url_query: str) -> dict[str, list[str]]:
        """AnyEvent.pm `extract_params`: the body (urlencoded or JSON) and the query."""
        params: dict[str, list[str]] = {}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if body and self.headers.get("Content-Type", "").startswith("application/json"):
            params = {k: [str(v)] for k, v in json.loads(body).items()}
        elif body:
            params = parse_qs(body, keep_blank_values=True)
        params.update(parse_qs(url_query, keep_blank_values=True))
        return params

    def _user(self) -> str:
        header = self.headers.get("Authorization") or ""
        marker = "PVEAPIToken="
        if marker not in header:
            raise AuthError("No ticket")
        value = unquote(header.split(marker, 1)[1].split(";", 1)[0].strip())
        try:
            return UserConfig(self.node.cfg.etc_pve).verify_token(value)
        except AuthError as exc:
            self.log_message("authentication failure: %s", exc)
            raise AuthError("Authentication failed!") from None

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        params = self._params(url.query)
        if not url.path.startswith("/api2/json/"):
            self._reply(501, f"no formatter for uri {url.path}", None)
            return
        path = "/" + url.path[len("/api2/json/") :].strip("/")
        try:
            user = self._user()
        except AuthError as exc:
            time.sleep(UNAUTHORIZED_DELAY_S)
            self._reply(401, str(exc), None, body=False)
            return
        vmid = path.split("/lxc/")[1].split("/")[0] if "/lxc/" in path else None
        trace.record(self.node.cfg, "api", [method.upper(), path, *sorted(params)], method,
                     vmid, path)  # fmt: skip
        found = find(method, path)
        if found is None:
            self._reply(501, f"Method '{method.upper()} {path}' not implemented", None)
            return
        route, path_params = found
        req = Request(self.node, path_params, params, user, UserConfig(self.node.cfg.etc_pve),
                      self._spawn)  # fmt: skip
        try:
            data = handle(req, route)
        except PveError as exc:
            reason = "Parameter verification failed." if exc.errors else str(exc).strip()
            self._reply(exc.code, reason, None, errors=exc.errors)
            return
        except Exception as exc:  # a Perl `die` in a handler: 500 with its message
            self._reply(500, str(exc).strip() or type(exc).__name__, None)
            return
        if isinstance(data, Paged):
            self._reply(200, "OK", data.data, total=data.total)
        else:
            self._reply(200, "OK", data)

    def _spawn(self, task: Task, user: str) -> str:
        return spawn(self.node.cfg, {"kind": task.kind, "ident": task.ident, "op": task.op,
                                     "args": list(task.args), "user": user})  # fmt: skip

    def _reply(self, code: int, message: str, data: object, errors: dict[str, str] | None = None,
               total: int | None = None, body: bool = True) -> None:  # fmt: skip
        reason = message.splitlines()[0] if message else ""
        payload: dict[str, object] = {"data": data}
        if code >= 400:
            payload["message"] = message.rstrip("\n") + "\n"
        if errors:
            payload["errors"] = errors
        if total is not None:
            payload["total"] = total
        raw = json.dumps(payload).encode() if body else b""
        self.send_response(code, reason)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        if code >= 400:
            self.send_header("Connection", "close")  # AnyEvent.pm: no keep-alive after errors
            self.close_connection = True
        self.end_headers()
        self.wfile.write(raw)


def serve(cfg: NodeConfig) -> None:
    ApiHandler.node = Node(cfg)
    server = ThreadingHTTPServer(("127.0.0.1", cfg.api_port), ApiHandler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    node_dir = cfg.etc_pve / "nodes" / cfg.node
    context.load_cert_chain(node_dir / "pve-ssl.pem", node_dir / "pve-ssl.key")
    # The handshake happens in each request's thread, so one slow client holds up no other.
    server.socket = context.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)  # fmt: skip
    (Path(cfg.root) / "api.ready").write_text(str(cfg.api_port))
    server.serve_forever()


if __name__ == "__main__":
    serve(NodeConfig.load())
