"""Users, API tokens and ACLs of the test node, as pve-access-control computes them.

Files, in Proxmox's formats: `/etc/pve/user.cfg` (`user:`, `token:USER!NAME:EXPIRE:PRIVSEP:...`,
`acl:PROPAGATE:PATH:USERS_OR_TOKENS:ROLES:`; src/PVE/AccessControl.pm `parse_user_config`) and
`/etc/pve/priv/token.cfg` (`USER!NAME SECRET` per line, what PVE::Cluster `verify_token` reads).
Roles are the built-in ones (`create_roles` over `$privgroups`); groups, pools and custom roles
are not modelled (the bed does not use them).

`permissions(user, path)` follows src/PVE/RPCEnvironment.pm `permissions` and `compile_acl_path`:
root@pam has every privilege; a token without privilege separation has its user's; a token with
it has the intersection of its own ACL roles and its user's. The roles on a path are those of
the most specific ACL entry on the way down from `/`, propagated ones only above the path
(AccessControl.pm `roles`).
"""

from __future__ import annotations

import time
from pathlib import Path

PRIVGROUPS: dict[str, dict[str, list[str]]] = {
    "VM": {
        "root": [],
        "admin": ["VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
                  "VM.Config.HWType", "VM.Config.Options", "VM.Allocate", "VM.Clone",
                  "VM.Migrate", "VM.Monitor", "VM.Snapshot", "VM.Snapshot.Rollback"],
        "user": ["VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup",
                 "VM.PowerMgmt"],
        "audit": ["VM.Audit"],
    },
    "Sys": {
        "root": ["Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"],
        "admin": ["Sys.Console", "Sys.Syslog"],
        "user": [],
        "audit": ["Sys.Audit"],
    },
    "Datastore": {
        "root": [],
        "admin": ["Datastore.Allocate", "Datastore.AllocateTemplate"],
        "user": ["Datastore.AllocateSpace"],
        "audit": ["Datastore.Audit"],
    },
}  # fmt: skip


def builtin_roles() -> dict[str, set[str]]:
    """AccessControl.pm `create_roles`: PVE<Cat>Admin, PVE<Cat>User, PVEAuditor, ..."""
    roles: dict[str, set[str]] = {"NoAccess": set(), "PVEAdmin": set(), "PVEAuditor": set()}
    every: set[str] = {"Permissions.Modify"}
    for cat, group in PRIVGROUPS.items():
        every.update(group["root"], group["admin"], group["user"], group["audit"])
        roles[f"PVE{cat}Admin"] = {*group["admin"], *group["user"], *group["audit"]}
        roles["PVEAdmin"] |= roles[f"PVE{cat}Admin"]
        if group["user"]:
            roles[f"PVE{cat}User"] = {*group["user"], *group["audit"]}
        roles["PVEAuditor"].update(group["audit"])
    roles["Administrator"] = every
    return roles


ROLES = builtin_roles()


class AuthError(Exception):
    """Why a token was refused (logged on the node; the client only sees 401)."""


class UserConfig:
    def __init__(self, etc_pve: Path) -> None:
        self.users: dict[str, bool] = {}  # user -> enabled
        self.tokens: dict[str, dict[str, int]] = {}  # USER!NAME -> {expire, privsep}
        self.acl: dict[str, dict[str, dict[str, bool]]] = {}  # path -> ugid -> role -> prop
        cfg = etc_pve / "user.cfg"
        for line in (cfg.read_text() if cfg.exists() else "").splitlines():
            fields = [f.strip() for f in line.strip().split(":")]
            kind, data = fields[0], fields[1:]
            if kind == "user" and data:
                self.users[data[0]] = data[1:2] == ["1"]
            elif kind == "token" and data:
                expire = int(data[1]) if len(data) > 1 and data[1].isdigit() else 0
                privsep = 1 if len(data) > 2 and data[2] not in ("", "0") else 0
                self.tokens[data[0]] = {"expire": expire, "privsep": privsep}
            elif kind == "acl" and len(data) >= 4:
                node = self.acl.setdefault(normalize(data[1]), {})
                for ugid in filter(None, data[2].split(",")):
                    for role in filter(None, data[3].split(",")):
                        if role in ROLES:
                            node.setdefault(ugid, {})[role] = data[0] == "1"
        secrets = etc_pve / "priv" / "token.cfg"
        self.secrets = dict(
            line.split(None, 1)
            for line in (secrets.read_text() if secrets.exists() else "").splitlines()
            if line.strip()
        )

    def verify_token(self, value: str) -> str:
        """The token id for `USER@REALM!NAME=SECRET` (AccessControl.pm `verify_token`)."""
        tokenid, sep, secret = value.rpartition("=")
        if not sep:
            raise AuthError("no tokenid specified")
        user, _, name = tokenid.partition("!")
        if not self.users.get(user):
            raise AuthError(f"user '{user}' is disabled or does not exist")
        if tokenid not in self.tokens:
            raise AuthError(f"no such token '{name}' for user '{user}'")
        if 0 < self.tokens[tokenid]["expire"] < time.time():
            raise AuthError(f"token '{name}' access expired")
        if self.secrets.get(tokenid, "").strip() != secret:
            raise AuthError("invalid token value!")
        return tokenid

    def _roles(self, ugid: str, path: str) -> dict[str, bool]:
        roles: dict[str, bool] = {}
        parts = [""] if path == "/" else path.split("/")
        for depth in range(1, len(parts) + 1):
            here = "/" + "/".join(p for p in parts[:depth] if p)
            final = depth == len(parts)
            entry = self.acl.get(here, {}).get(ugid)
            if entry:
                new = {role: prop for role, prop in entry.items() if final or prop}
                if new:
                    roles = new  # a more specific entry replaces what came from above
        return roles

    def privileges(self, ugid: str, path: str) -> set[str]:
        return set().union(*(ROLES[role] for role in self._roles(ugid, path)))

    def permissions(self, user: str, path: str) -> set[str]:
        if user == "root@pam":
            return set(ROLES["Administrator"])
        owner, bang, _ = user.partition("!")
        if not bang:
            return self.privileges(user, path)
        mine = self.permissions(owner, path)
        if not self.tokens.get(user, {}).get("privsep"):
            return mine
        return mine & self.privileges(user, path)


def normalize(path: str) -> str:
    return "/" + "/".join(p for p in path.split("/") if p)


def check(cfg: UserConfig, user: str, path: str, privs: list[str], any_of: bool = False) -> str:
    """RPCEnvironment.pm `check` / `check_any`: '' when allowed, else the 403 text."""
    have = cfg.permissions(user, path)
    if any_of:
        if have & set(privs):
            return ""
        return f"Permission check failed ({path}, {'|'.join(privs)})"
    for priv in privs:
        if priv not in have:
            return f"Permission check failed ({path}, {priv})"
    return ""
