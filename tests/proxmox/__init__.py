"""Tests over the loopback Proxmox test bed (tests/testbed): the bed itself, the `pct`/`pvesh`
doubles, and the dflash_proxmox module through real ansible-playbook runs."""
