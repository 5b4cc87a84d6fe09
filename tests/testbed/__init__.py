"""The loopback Proxmox test bed: a real sshd, real LXC containers, `pct`/`pvesh` test doubles.

- `bed.Testbed`: bring-up, tear-down, inventory, trace, fault injection (see its docstrings);
- `pytest_plugin`: the session fixture `proxmox_testbed`;
- `python -m tests.testbed up|down|status`: a bed by hand, for debugging;
- `node/`: what runs on the node (the doubles), standard library only.

Nothing is imported here: the doubles import this package on every `pct exec`.
"""
