"""The node's `pct` and `pvesh`: small shell shims that start the doubles in node/."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from .node.nodecfg import ENV_VAR

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_shims(root: Path) -> tuple[Path, Path]:
    """/usr/sbin/pct and /usr/bin/pvesh as the node's sessions see them (overlay upper layers).

    Both read the node from <root>/node.json (NodeConfig), written at bring-up.
    """
    sbin, bindir = root / "shim" / "sbin", root / "shim" / "bin"
    for folder, tool in ((sbin, "pct"), (bindir, "pvesh")):
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / tool
        # -S: the doubles use the standard library only, and skip site for a faster start.
        script.write_text(
            "#!/bin/sh\n"
            f"# {tool} test double of the dflash test bed (generated)\n"
            f"{ENV_VAR}={shlex.quote(str(root / 'node.json'))}; export {ENV_VAR}\n"
            f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}; export PYTHONPATH\n"
            f'exec {shlex.quote(sys.executable)} -S -m tests.testbed.node.{tool} "$@"\n'
        )
        script.chmod(0o755)
    return sbin, bindir
