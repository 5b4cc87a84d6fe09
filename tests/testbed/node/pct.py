"""`pct` test double: Proxmox's container CLI over real LXC (see lxcctl.py for the differences).

Forms: `pct exec VMID [--keep-env 0|1] [--] CMD...`, `pct status VMID [--verbose 1]`,
`pct start|stop|shutdown VMID`, `pct config VMID [--snapshot NAME] [--current 1]`, `pct list`,
`pct snapshot VMID NAME [--description TEXT]`, `pct delsnapshot VMID NAME`,
`pct listsnapshot VMID`, `pct unlock VMID` (pve-container src/PVE/CLI/pct.pm). Output formats,
error texts and exit codes follow Proxmox's (an unknown VMID: "Configuration file
'nodes/<node>/lxc/<vmid>.conf' does not exist", exit 2). Tasks run in the foreground, as the
CLI's do. Every invocation is appended to the node's trace file.
"""

from __future__ import annotations

import os
import sys

from . import trace
from .cli import EXIT_DIE, EXIT_ENOENT, check_vmid, die, split_options
from .nodecfg import CT_PATH, ENV_VAR, NodeConfig

TYPE_CHECKING = False  # not from typing: see cli.py
if TYPE_CHECKING:
    from .ops import Node, Task

# pct.pm `clean_environment` drops these; the others are the double's own (the shim's).
NOT_PASSED = {"SSL_CERT_FILE", "SSL_CERT_DIR", ENV_VAR, "PYTHONPATH"}
COMMANDS = ("config", "delsnapshot", "exec", "list", "listsnapshot", "shutdown", "snapshot",
            "start", "status", "stop", "unlock")  # fmt: skip
USAGE = {
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "status": "pct status <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]",
    "snapshot": "pct snapshot <vmid> <snapname> [OPTIONS]",
    "delsnapshot": "pct delsnapshot <vmid> <snapname> [OPTIONS]",
    "listsnapshot": "pct listsnapshot <vmid>",
    "unlock": "pct unlock <vmid>",
}


def _usage_all() -> str:
    return "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n" + "".join(
        f"       {USAGE.get(c, 'pct ' + c)}\n" for c in COMMANDS
    )


def _run_task(node: Node, task: Task) -> int:
    """pct.pm's `$upid_exit`: the worker runs in the foreground, its output on stdout; exit 255
    when it ended with an error (printed on stderr), 0 after OK or WARNINGS."""
    from .tasks import run

    _, final = run(node.cfg, task.kind, task.ident, "root@pam",
                   lambda log: node.run(task, log), echo=True)  # fmt: skip
    sys.stdout.flush()
    if final.startswith("TASK ERROR: "):
        sys.stderr.write(final[len("TASK ERROR: ") :] + "\n")
        return EXIT_DIE
    if final.startswith("TASK WARNINGS: "):
        sys.stderr.write(f"Task finished with {final.split()[-1]} warning(s)!\n")
    return 0


def _print_config(data: dict[str, object]) -> None:
    for key in sorted(data):
        if key in ("digest", "lxc"):
            continue
        print(f"{key}: {data[key]}")
    for key, value in data.get("lxc", []):  # type: ignore[misc]
        print(f"{key}: {value}")


def _print_list(rows: list[dict[str, object]]) -> None:
    if not rows:
        return
    line = "{:<10} {:<10} {:<12} {:<20}"
    print(line.format("VMID", "Status", "Lock", "Name"))
    for row in sorted(rows, key=lambda r: int(r["vmid"])):  # type: ignore[call-overload]
        print(line.format(row["vmid"], row["status"], row.get("lock", ""), row["name"]))


def _print_snapshot_tree(rows: list[dict[str, object]]) -> None:
    """Roughly `pct listsnapshot`: one line per snapshot, oldest first, `current` last."""
    snaps = [r for r in rows if r["name"] != "current"]
    snaps.sort(key=lambda r: int(str(r["snaptime"])))
    for row in snaps:
        print(f"`-> {row['name']:<30} {row['snaptime']} {row['description']}")
    print("`-> current                        You are here!")


def _exec(cfg: NodeConfig, argv: list[str]) -> int:
    """`pct exec VMID [--keep-env 0|1] [--] CMD...`, the hot path of every Ansible task, kept to
    few imports. pve-container src/PVE/CLI/pct.pm `exec`: the container must exist and run;
    `--keep-env` defaults to 1 on PVE 8, so the caller's environment (an SSH session's LANG,
    SSH_*, proxy variables) reaches the command, less SSL_CERT_FILE/SSL_CERT_DIR
    (`clean_environment`); PATH is what PVE::CLIHandler sets."""
    vmid_arg = argv[1] if len(argv) > 1 else None
    trace.record(cfg, "pct", argv, "exec", vmid_arg)
    vmid = check_vmid(vmid_arg, USAGE["exec"])
    rest = argv[2:]
    keep_env = True
    while rest and rest[0].lstrip("-").split("=")[0] == "keep-env":
        value = rest[0].partition("=")[2] or (rest[1] if len(rest) > 1 else "")
        rest = rest[1:] if "=" in rest[0] else rest[2:]
        keep_env = value not in ("0", "false", "no", "off")
    command = rest[1:] if rest[:1] == ["--"] else rest
    if not cfg.conf_path(vmid).is_file():
        die(cfg.missing_message(vmid), EXIT_ENOENT)
    if not cfg.init_running(vmid):
        die(f"container '{vmid}' not running!")
    if not command:
        die("missing command")
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    env["PATH"] = CT_PATH
    flag = "--keep-env" if keep_env else "--clear-env"
    # Proxmox execs lxc-attach too: its exit code, stdout and stderr are the command's.
    os.execvpe("lxc-attach", ["lxc-attach", "-n", str(vmid), "-P", str(cfg.lxcpath), flag,
                              "--", *command], env)  # fmt: skip


def run(argv: list[str]) -> int:
    cfg = NodeConfig.load()
    cmd = argv[0] if argv else ""
    if cmd == "exec":
        return _exec(cfg, argv)
    from .ops import Node, PveError

    node = Node(cfg)
    positional, options = split_options(argv[1:])
    vmid_arg = positional[0] if positional else None
    trace.record(cfg, "pct", argv, cmd, vmid_arg)
    if cmd not in COMMANDS:
        die(f"ERROR: unknown command 'pct {cmd}'\n{_usage_all()}" if cmd else _usage_all())
    if cmd == "list":
        _print_list(node.list())
        return 0
    vmid = check_vmid(vmid_arg, USAGE.get(cmd, ""))
    try:
        if cmd == "status":
            data = node.status(vmid)
            if options.get("verbose", ["0"])[-1] in ("1", "true", "yes"):
                for key in sorted(data):
                    if not isinstance(data[key], dict):
                        print(f"{key}: {data[key]}")
            else:
                print(f"status: {data['status']}")
            return 0
        if cmd == "start":
            return _run_task(node, node.start(vmid))
        if cmd == "stop":
            return _run_task(node, node.stop(vmid))
        if cmd == "shutdown":
            return _run_task(node, node.stop(vmid, int(options.get("timeout", ["60"])[-1])))
        if cmd == "config":
            current = options.get("current", ["0"])[-1] in ("1", "true", "yes")
            _print_config(node.config(vmid, options.get("snapshot", [None])[-1], current))
            return 0
        if cmd in ("snapshot", "delsnapshot"):
            if len(positional) < 2:
                die(f"400 not enough arguments\n{USAGE[cmd]}")
            if cmd == "snapshot":
                task = node.snapshot(vmid, positional[1], options.get("description", [""])[-1])
            else:
                task = node.delete_snapshot(vmid, positional[1])
            return _run_task(node, task)
        if cmd == "unlock":
            node.unlock(vmid)
            return 0
        if cmd == "listsnapshot":
            _print_snapshot_tree(node.snapshots(vmid))
            return 0
    except PveError as exc:
        die(str(exc), exc.exit_code)
    return EXIT_DIE


def main() -> None:
    raise SystemExit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
