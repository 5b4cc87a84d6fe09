# How the dflash_proxmox modules reach the Proxmox API (module_utils/dflash_proxmox.py,
# auth_argument_spec) and, as CONTAINER, which container they work on.


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_host:
    description: Host name or address of the Proxmox node's API.
    type: str
    required: true
  api_port:
    description: Port of the API.
    type: int
    default: 8006
  api_user:
    description: The Proxmox user owning the token, for example V(dflash@pve).
    type: str
    required: true
  api_token_id:
    description:
      - Name of the API token (without the user), for example V(deploy).
      - Defaults to the environment variable E(PROXMOX_TOKEN_ID).
    type: str
    required: true
  api_token_secret:
    description:
      - Secret of the API token. Never logged.
      - Defaults to the environment variable E(PROXMOX_TOKEN_SECRET).
    type: str
    required: true
  validate_certs:
    description:
      - Verify the API's TLS certificate, against O(ca_file) when set (the roles set it from
        C(proxmox_api_ca_file)).
    type: bool
    default: true
  ca_file:
    description:
      - The CA certificate(s) to verify the API's TLS certificate against, for example a copy
        of the cluster's C(/etc/pve/pve-root-ca.pem). Default the system's CA bundle, or
        E(REQUESTS_CA_BUNDLE). Ignored with O(validate_certs=false).
    type: path
  api_timeout:
    description: Seconds to wait for the connection and for each API call.
    type: int
    default: 10
requirements:
  - proxmoxer >= 2.0
  - requests
"""

    CONTAINER = r"""
options:
  node:
    description: Proxmox node name that holds the container.
    type: str
    required: true
  vmid:
    description: VMID of the container.
    type: int
    required: true
"""
