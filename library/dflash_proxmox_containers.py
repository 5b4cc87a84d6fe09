#!/usr/bin/python
# The check of dflash_proxmox for every container of a play in one module run: one API session
# per node (and credentials), each node's container list read once, the starts of stopped
# containers requested together and then waited for. A container that is not ready fails its
# own entry, not the run: the role refuses each host with its own message.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: dflash_proxmox_containers
short_description: Check several Proxmox LXC containers before a deploy, one API session per node
description:
  - The check of M(dflash_proxmox) (see C(ansible-doc dflash_proxmox) for what is checked and
    said) for many containers in one run on the controller (C(run_once), C(delegate_to)
    V(localhost)), so that a play over N containers of a node pays the module's start-up and
    the API's TLS handshake once, not N times.
  - Entries that share the API endpoint and token share one connection; the containers of a
    node are listed once for all of them.
  - The containers of a session are checked side by side (up to 8 API calls in flight), and
    stopped ones (with C(start_if_stopped)) are all asked to start before the module waits for
    any, so their starts overlap.
  - A container that is not ready, or whose entry is wrong, is reported in its own entry of
    RV(containers) (C(failed), C(msg)); the module itself fails only when nothing can run at
    all (a missing library, an entry without a name). The role fails each such host with its
    message.
  - Reports C(changed) when it started a container. In check mode it says it would.
extends_documentation_fragment:
  - dflash_attributes
attributes:
  check_mode:
    support: full
    details: Reads only; a start that would happen is reported as changed.
  diff_mode:
    support: none
options:
  containers:
    description:
      - One entry per container, each with a C(name) (the inventory host, the key of its
        answer in RV(containers)) and the options of M(dflash_proxmox) (C(api_host),
        C(api_user), C(node), C(vmid), C(gpus), C(mounts), C(snapshot), ...), checked as that
        module checks them. An option left out or set to V(null) takes that module's default
        (C(api_token_id) and C(api_token_secret) from E(PROXMOX_TOKEN_ID) and
        E(PROXMOX_TOKEN_SECRET)).
    type: list
    elements: dict
    required: true
requirements:
  - proxmoxer >= 2.0
  - requests
author: dflash-deploy
"""

EXAMPLES = r"""
- name: Check every container of the play, once per node
  dflash_proxmox_containers:
    containers:
      - name: trainer-a
        api_host: pve1.example.org
        api_user: dflash@pve
        api_token_id: deploy
        ca_file: /etc/dflash/pve-root-ca.pem
        node: pve1
        vmid: 201
        mounts:
          - path: /mnt/wheelhouse
      - name: trainer-b
        api_host: pve1.example.org
        api_user: dflash@pve
        api_token_id: deploy
        ca_file: /etc/dflash/pve-root-ca.pem
        node: pve1
        vmid: 202
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
containers:
  description:
    - Entry name -> the answer for that container, with the keys M(dflash_proxmox) returns
      (C(vmid), C(node), C(status), C(started), C(config), C(pending), C(snapshot),
      C(actions)) and, for a container that is not ready, C(failed) (V(true)) and C(msg) (every
      problem, with its fix).
  type: dict
  returned: always
sessions:
  description: API sessions opened (one per endpoint and token).
  type: int
  returned: success
"""

import contextlib
import importlib.util
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import (
    PROXMOXER_ERROR,
    ProxmoxError,
    token_name,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox import (
    connect as api_connect,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_proxmox_check import (
    container_argument_spec,
    finish_start,
    list_node,
    pending_warning,
    ready,
    request_start,
    validate,
)

# API calls in flight at once per session (requests' connection pool keeps 10 by default).
PARALLEL_CALLS = 8
# What makes two entries share one API session.
SESSION_KEYS = ("api_host", "api_port", "api_user", "api_token_id", "api_token_secret",
                "validate_certs", "ca_file", "api_timeout")  # fmt: skip


def entry_params(
    module: AnsibleModule, validator: ArgumentSpecValidator, name: str, entry: dict[str, Any]
) -> dict[str, Any]:
    """An entry checked as dflash_proxmox checks its options; its secrets are never shown."""
    checked = validator.validate({k: v for k, v in entry.items() if v is not None})
    module.no_log_values.update(checked._no_log_values)
    if checked.error_messages:
        raise ProxmoxError(
            f"the check of {name} (container {entry.get('vmid')}) got wrong options: "
            + "; ".join(checked.error_messages)
            + " (from the proxmox_* variables of that host); nothing was changed"
        )
    params = checked.validated_parameters
    validate(params)
    return params


def check_entry(api: Any, module: AnsibleModule, params: dict[str, Any], result: dict[str, Any],
                listed: dict[str, list[int]]) -> str | None:  # fmt: skip
    """One container's check; the UPID of the start it requested, if any."""
    try:
        ready(api, params, result, listed)
        warning = pending_warning(params, result)
        if warning:
            module.warn(warning)
        if result["status"] == "running":
            return None
        result["started"] = True
        if module.check_mode:
            result["actions"].append(f"would start container {params['vmid']} (it is stopped)")
            return None
        return request_start(api, params)
    except ProxmoxError as exc:
        result.update(failed=True, msg=str(exc))
        return None


def wait_started(api: Any, params: dict[str, Any], upid: str, result: dict[str, Any]) -> None:
    try:
        finish_start(api, params, upid, result)
    except ProxmoxError as exc:
        result.update(failed=True, msg=str(exc))


def check_session(module: AnsibleModule, entries: dict[str, dict[str, Any]],
                  results: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    """Every entry of one API session, side by side (the API serves calls in parallel, as
    pveproxy's workers do): each node listed once, then every container checked, the starts
    requested, and all of them waited for."""
    first = next(iter(entries.values()))
    try:
        api = api_connect(first)
    except ProxmoxError as exc:
        for name in entries:
            results[name].update(failed=True, msg=str(exc))
        return
    listed: dict[str, list[int]] = {}
    for params in entries.values():
        # once per node before the threads; a failure is each entry's own, said below
        with contextlib.suppress(ProxmoxError):
            list_node(api, params["node"], params["vmid"], token_name(params), listed)
    names = list(entries)
    with ThreadPoolExecutor(max_workers=min(PARALLEL_CALLS, len(names))) as pool:
        upids = pool.map(
            lambda name: check_entry(api, module, entries[name], results[name], listed), names
        )
        starting = {name: upid for name, upid in zip(names, upids, strict=True) if upid}
        list(pool.map(
            lambda name: wait_started(api, entries[name], starting[name], results[name]), starting
        ))  # fmt: skip


def main() -> None:
    module = AnsibleModule(
        argument_spec={"containers": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    if PROXMOXER_ERROR is not None:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_ERROR)
    if importlib.util.find_spec("requests") is None:
        module.fail_json(msg=missing_required_lib("requests", reason="the Proxmox API (HTTPS)"))
    validator = ArgumentSpecValidator(container_argument_spec())
    results: dict[str, dict[str, Any]] = {}
    sessions: dict[tuple, dict[str, dict[str, Any]]] = {}
    for entry in module.params["containers"]:
        entry = dict(entry)
        name = entry.pop("name", None)
        if not name or name in results:
            module.fail_json(msg=f"every entry of containers needs its own name, got {name!r}")
        results[name] = {"vmid": entry.get("vmid"), "node": entry.get("node"),
                         "started": False, "actions": []}  # fmt: skip
        try:
            params = entry_params(module, validator, name, entry)
        except ProxmoxError as exc:
            results[name].update(failed=True, msg=str(exc))
            continue
        sessions.setdefault(tuple(params[k] for k in SESSION_KEYS), {})[name] = params
    for entries in sessions.values():
        check_session(module, entries, results)
    module.exit_json(
        changed=any(r["started"] for r in results.values()),
        containers=results,
        sessions=len(sessions),
    )


if __name__ == "__main__":
    main()
