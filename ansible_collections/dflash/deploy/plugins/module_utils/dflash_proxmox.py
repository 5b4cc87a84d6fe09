# Shared plumbing of the dflash_proxmox modules: the connection to the Proxmox API (HTTPS, an
# API token), one call whose error says which call failed and what to do, and a bounded wait
# for a task. Option names follow community.proxmox's (api_host, api_user, api_token_id,
# api_token_secret, validate_certs) plus api_timeout.
from __future__ import annotations

import re
import ssl
import time
import traceback
from typing import Any

from ansible.module_utils.basic import env_fallback

try:
    from cryptography import x509
except ImportError:  # only the certificate advice reads it (ansible-core requires it)
    x509 = None

try:
    from proxmoxer import ProxmoxAPI, ResourceException

    PROXMOXER_ERROR = None
except ImportError:  # reported by the module with missing_required_lib
    ProxmoxAPI = None
    ResourceException = Exception
    PROXMOXER_ERROR = traceback.format_exc()

# The role that holds each privilege the modules need, for the fix in a 403's message.
ROLE_FOR = {
    "VM.Audit": "PVEAuditor",
    "VM.PowerMgmt": "PVEVMUser",
    "VM.Snapshot": "PVEVMAdmin",
    "Sys.Audit": "PVEAuditor",
}
TASK_POLL_S = 0.5
LOG_TAIL_LINES = 8


def auth_argument_spec() -> dict[str, Any]:
    return {
        "api_host": {"type": "str", "required": True},
        "api_port": {"type": "int", "default": 8006},
        "api_user": {"type": "str", "required": True},
        "api_token_id": {
            "type": "str",
            "required": True,
            "no_log": False,
            "fallback": (env_fallback, ["PROXMOX_TOKEN_ID"]),
        },
        "api_token_secret": {
            "type": "str",
            "required": True,
            "no_log": True,
            "fallback": (env_fallback, ["PROXMOX_TOKEN_SECRET"]),
        },
        "validate_certs": {"type": "bool", "default": True},
        "ca_file": {"type": "path"},
        "api_timeout": {"type": "int", "default": 10},
    }


class ProxmoxError(Exception):
    """A failure whose message says what was expected, what was found and the fix."""


def token_name(params: dict[str, Any]) -> str:
    return f"{params['api_user']}!{params['api_token_id']}"


def connect(params: dict[str, Any]) -> Any:
    """An API handle, checked with one call (GET /version) so that an unreachable node, an
    untrusted certificate and a refused token each fail here with their own fix."""
    where = f"https://{params['api_host']}:{params['api_port']}"
    api = ProxmoxAPI(
        params["api_host"],
        port=params["api_port"],
        user=params["api_user"],
        token_name=params["api_token_id"],
        token_value=params["api_token_secret"],
        # a CA file (the node's own pve-root-ca.pem) or True: the system's, REQUESTS_CA_BUNDLE
        verify_ssl=(params.get("ca_file") or True) if params["validate_certs"] else False,
        timeout=params["api_timeout"],
    )
    try:
        api.version.get()
    except ResourceException as exc:
        if getattr(exc, "status_code", None) == 401:
            raise ProxmoxError(
                f"the Proxmox API at {where} refused the token {token_name(params)} "
                f"({exc.content}); check api_user, api_token_id and the secret "
                "(PROXMOX_TOKEN_SECRET or a vaulted proxmox_api_token_secret)"
            ) from exc
        raise ProxmoxError(f"the Proxmox API at {where} answered {exc}") from exc
    except Exception as exc:  # TLS, refused, timeouts
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            raise ProxmoxError(
                f"the certificate of the Proxmox API at {where} is not trusted ({exc}); "
                + certificate_advice(params["api_host"], params["api_port"])
            ) from exc
        raise ProxmoxError(
            f"cannot reach the Proxmox API at {where} ({exc or type(exc).__name__}); check "
            "api_host/api_port and that the node is up"
        ) from exc
    return api


def certificate_advice(host: str, port: int) -> str:
    """The certificate the node serves (read without checking it) and the CA file that would
    validate it: Proxmox's own cluster CA, the certificate itself when self-signed, or the CA
    that issued a custom or ACME one."""
    try:
        pem = ssl.get_server_certificate((host, port), timeout=10)
        cert = x509.load_pem_x509_certificate(pem.encode())
        subject, issuer = cert.subject.rfc4514_string(), cert.issuer.rfc4514_string()
    except Exception as exc:  # cryptography missing, or the node went away meanwhile
        return (
            f"(the certificate it serves could not be read: {exc}) set proxmox_api_ca_file to "
            "the CA that signed it: for Proxmox's own (pve-ssl.pem) a copy of the cluster's "
            "/etc/pve/pve-root-ca.pem, for a custom or ACME one (pveproxy-ssl.pem) its issuer's "
            "chain; where the network is trusted, proxmox_api_validate_certs: false"
        )
    served = f"it serves subject {subject}, issued by {issuer}"
    if "PVE Cluster Manager CA" in issuer:
        fix = (
            "Proxmox's own node certificate (pve-ssl.pem): set proxmox_api_ca_file to a copy of "
            "the cluster's /etc/pve/pve-root-ca.pem"
        )
    elif subject == issuer:
        fix = (
            "a self-signed certificate (a custom /etc/pve/nodes/<node>/pveproxy-ssl.pem): set "
            "proxmox_api_ca_file to a copy of that certificate itself"
        )
    else:
        fix = (
            "a custom or ACME certificate (/etc/pve/nodes/<node>/pveproxy-ssl.pem), which "
            f"pve-root-ca.pem does not validate: set proxmox_api_ca_file to the chain of {issuer}, "
            "or, for a public CA (ACME: Let's Encrypt), leave proxmox_api_ca_file unset so that "
            "the system's CA bundle is used"
        )
    return f"{served}: {fix}; where the network is trusted, proxmox_api_validate_certs: false"


def call(what: str, func: Any, *args: Any, token: str = "", **kwargs: Any) -> Any:
    """One API call; an API error becomes a ProxmoxError that says which call failed (and, for
    a missing privilege, which role grants it)."""
    try:
        return func(*args, **kwargs)
    except ResourceException as exc:
        detail = str(getattr(exc, "content", "") or exc).strip()
        errors = getattr(exc, "errors", None)
        if errors:
            detail += f" {errors}"
        missing = re.search(r"Permission check failed \((\S+), ([\w.|]+)\)", detail)
        if missing:
            path, priv = missing[1], missing[2].split("|")[0]
            role = ROLE_FOR.get(priv, "PVEVMAdmin")
            raise ProxmoxError(
                f"{what} failed: {detail}; token {token} lacks {priv} on {path}: grant it, e.g. "
                f"pveum acl modify {path} --tokens '{token}' --roles {role}"
            ) from exc
        raise ProxmoxError(f"{what} failed: {detail}") from exc
    except Exception as exc:  # transport errors after a good start (node went away, timeouts)
        raise ProxmoxError(
            f"{what} failed: cannot reach the Proxmox API ({exc or type(exc).__name__})"
        ) from exc


def log_tail(api: Any, node: str, upid: str) -> str:
    """The last lines of a task's log, one string (limit 0 reads the whole log)."""
    try:
        lines = api.nodes(node).tasks(upid).log.get(limit=0)
    except Exception as exc:
        return f"(its log could not be read: {exc})"
    text = [str(line.get("t", "")) for line in lines[-LOG_TAIL_LINES:]]
    return " | ".join(t for t in text if t) or "(empty)"


def wait_task(api: Any, node: str, upid: str, timeout: int, what: str, token: str = "") -> str:
    """Wait, bounded, for a task to stop. OK and `WARNINGS: N` are success (pve-common
    Tools.pm `upid_status_is_error`); returns the exit status. Any other exit status, or the
    time running out, raises with the tail of the task's log."""
    deadline = time.monotonic() + timeout
    while True:
        task = call(
            f"reading the task of {what}", api.nodes(node).tasks(upid).status.get, token=token
        )
        if task.get("status") == "stopped":
            status = str(task.get("exitstatus") or "")
            if status == "OK" or re.fullmatch(r"WARNINGS: \d+", status):
                return status
            raise ProxmoxError(
                f"{what} failed: {status} (task {upid}; its log ends: {log_tail(api, node, upid)})"
            )
        if time.monotonic() >= deadline:
            raise ProxmoxError(
                f"{what}: task {upid} still running after {timeout} s (its log so far: "
                f"{log_tail(api, node, upid)}); it goes on on node {node}: see its task log "
                "there, or raise the timeout"
            )
        time.sleep(TASK_POLL_S)
