"""A task worker forked by the HTTPS API: `python -m tests.testbed.node.worker REQUEST_JSON`.

Like pve-common src/PVE/RESTEnvironment.pm `fork_worker` (not `cli`): the worker hands its UPID
to the parent (first line on stdout, then stdout goes to /dev/null) and does the work in the
background, logging to the task's file, which ends with TASK OK / WARNINGS / ERROR.
"""

from __future__ import annotations

import json
import os
import sys

from .nodecfg import NodeConfig
from .ops import Node, Task
from .tasks import run


def main() -> None:
    request = json.loads(sys.argv[1])
    node = Node(NodeConfig.load())
    task = Task(request["kind"], request["ident"], request["op"], tuple(request["args"]))

    def announce(upid: str) -> None:
        sys.stdout.write(upid + "\n")
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the parent has its UPID; nothing else goes back on that pipe
        os.close(devnull)

    run(node.cfg, task.kind, task.ident, request["user"], lambda log: node.run(task, log),
        announce)  # fmt: skip


if __name__ == "__main__":
    main()
