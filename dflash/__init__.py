"""DFlash drafter trainer: train a block-diffusion drafter on a frozen target's hidden states."""

import os

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. On a small shared
# CPU (the embedded sandbox: 2 cores beside Ansible) spinning threads made CPU steps ~4x slower.
# An explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
