"""`python -m tests.testbed up [--containers N]` / `down [--all]` / `status`."""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from . import registry
from .bed import Testbed
from .procs import ProcRef
from .teardown import reap_stale, teardown_state

CLI_NAME = "cli"


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def cmd_up(args: argparse.Namespace) -> int:
    began = time.monotonic()
    bed = Testbed.up(containers=args.containers, name=args.name, node=args.node,
                     persistent=True, log=_log)  # fmt: skip
    inventory = bed.inventory()
    ssh = (f"ssh -i {bed.private_key} -p {bed.port} -o UserKnownHostsFile={bed.known_hosts} "
           f"{bed.user}@{bed.host}")  # fmt: skip
    down = "python -m tests.testbed down" + (
        "" if args.name == CLI_NAME else f" --name {args.name}"
    )
    print(f"""test bed {bed.name!r} up in {time.monotonic() - began:.1f} s
  inventory:  {inventory}
  node:       {bed.node} (sshd on {bed.host}:{bed.port}; `pct` and `pvesh` are the doubles)
  api:        {bed.api_url} (token dflash@pve!deploy in the inventory; CA {bed.ca_file})
  containers: {", ".join(map(str, bed.vmids))} (privileged: {bed.privileged or "none"})
  wheelhouse: {bed.wheelhouse} (node) -> {bed.wheelhouse_ct} (containers, read-only)
  trace:      {bed.trace_path}
  state:      {registry.path_for(bed.name)}
try:
  .venv/bin/ansible -i {inventory} all -m ansible.builtin.ping
  {ssh} /usr/sbin/pct list
tear down:
  {down}""")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    beds = registry.load_all()
    names = list(beds) if args.all else [args.name]
    if not args.all and args.name not in beds:
        print(f"no test bed named {args.name!r} is up (known: {', '.join(beds) or 'none'})")
        return 1
    for name in names:
        teardown_state(beds[name], _log)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    reap_stale(_log)
    beds = registry.load_all()
    if not beds:
        print("no test bed is up")
    for name, state in beds.items():
        sshd = ProcRef.from_json(state["sshd"]) if state.get("sshd") else None
        alive = "up" if sshd and sshd.alive() else "sshd not running"
        port = state.get("port", "?")
        print(f"{name}: {alive}, port {port}, vmids {state['vmids']}, {state['root']}")
        if args.verbose:
            print("  " + shlex.join(["inventory:", f"{state['root']}/inventory.yml"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="bring a bed up and leave it running")
    up.add_argument("--containers", type=int, default=2, help="number of containers (1-8)")
    up.add_argument("--name", default=CLI_NAME)
    up.add_argument("--node", default="pve", help="Proxmox node name")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop a bed brought up by `up`")
    down.add_argument("--name", default=CLI_NAME)
    down.add_argument("--all", action="store_true", help="every bed on this machine")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="list the beds that are up")
    status.add_argument("-v", "--verbose", action="store_true")
    status.set_defaults(func=cmd_status)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
