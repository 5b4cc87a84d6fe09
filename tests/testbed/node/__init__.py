"""Node side of the test bed: what runs on the "Proxmox node" (the `pct` and `pvesh` doubles).

These modules use the standard library only and are started through small shell shims, so a
`pct exec` costs one short Python start before it becomes `lxc-attach`.
"""
