# Controller-side filter: inventory and -e variables that look like ours but that no part of
# the toolkit reads (a typo such as dflash_keep_release is otherwise silently ignored).
from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"\bdflash_[a-z0-9_]+\b")
# YAML comments (a whole line, or after a space): prose may name a typo as an example.
_COMMENT = re.compile(r"(^|\s)#.*$", re.MULTILINE)
# Where every variable the toolkit reads is named: role defaults, argument specs, tasks,
# templates and playbooks.
_SOURCES = ("roles/**/*.yml", "roles/**/*.j2", "playbooks/*.yml", "inventory/*.yml")


@functools.cache
def known_names() -> frozenset[str]:
    names: set[str] = set()
    for pattern in _SOURCES:
        for path in REPO.glob(pattern):
            text = _COMMENT.sub("", path.read_text(encoding="utf-8", errors="replace"))
            names.update(_NAME.findall(text))
    return frozenset(names)


def unknown_vars(names: list[str]) -> list[str]:
    """One sentence per `dflash_*` name that no part of the toolkit reads, naming the closest
    known one; [] when every name is known."""
    known = known_names()
    out = []
    for name in sorted(set(names) - known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else "no dflash role reads it"
        out.append(f"{name} is set but unknown to dflash-deploy ({hint})")
    return out


# Old name -> new name of the variables renamed for one name per concept (issue 27). The
# old names still work for one release (roles/dflash/defaults/main.yml maps them), then go.
RENAMED = {
    "dflash_lock": "dflash_env_lock",
    "dflash_lock_wait": "dflash_deploy_lock_wait",
    "dflash_lock_stale_after": "dflash_deploy_lock_stale_after",
    "dflash_lock_break": "dflash_deploy_lock_break",
}


def renamed_vars(names: list[str]) -> list[str]:
    """One warning per old name that is set, naming its new name."""
    return [
        f"{old} is renamed {RENAMED[old]}: the old name still works in this release and is "
        f"gone in the next; rename it where you set it (an inventory, -e)"
        + (f". {RENAMED[old]} is set too, and wins" if RENAMED[old] in names else "")
        for old in sorted(set(names) & RENAMED.keys())
    ]


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_unknown_vars": unknown_vars, "dflash_renamed_vars": renamed_vars}
