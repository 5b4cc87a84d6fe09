# The release archive carried inside the unpack module's call: one round trip to the target
# instead of a folder, a file push and the unpack (over pct each is a `pct exec`).
from __future__ import annotations

import base64
import os

# Module arguments travel as JSON through the controller's memory and the transport; a larger
# archive (data files under dflash/) is pushed as a file instead.
INLINE_LIMIT_BYTES = 8 * 1024 * 1024


def archive_b64(path: str, limit: int = INLINE_LIMIT_BYTES) -> str:
    """The archive at `path` (on the controller) as base64 text; '' when larger than `limit`."""
    if os.path.getsize(path) > limit:
        return ""
    with open(path, "rb") as handle:
        return base64.b64encode(handle.read()).decode("ascii")


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_archive_b64": archive_b64}
