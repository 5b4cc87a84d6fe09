# One verify finding (docs/verify.md): what kind of drift, what was expected, what was
# found, the fix, and what it concerns (path, package, pid, gpu). Standard library only.
from __future__ import annotations

from typing import Any


def finding(kind: str, expected: Any, found: Any, hint: str, **extra: Any) -> dict:
    return {"kind": kind, "expected": expected, "found": found, "hint": hint, **extra}
