# Credentials never reach history.jsonl or a report: a lock's index URLs lose their user:password
# part before the lock is recorded; a rollback that rebuilds an env from such a lock gets them
# back from the inventory's lock when it names the same index.
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "REDACTED"
URL_KEYS = ("index_url", "extra_index_url")


def redact_url(url: str) -> str:
    """`https://user:secret@host/simple` -> `https://REDACTED@host/simple`."""
    parts = urlsplit(str(url))
    if parts.username is None and parts.password is None:
        return str(url)
    host = parts.hostname or ""
    netloc = f"{REDACTED}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redact_lock(lock: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of the lock whose source URLs hold no credentials (new dicts: Ansible hands
    filters lazily templated containers, which are not to be deep-copied or changed)."""
    if not isinstance(lock, dict) or not isinstance(lock.get("source"), dict):
        return lock
    source = {key: redact_url(value) if key in URL_KEYS and value else value
              for key, value in lock["source"].items()}  # fmt: skip
    return {**lock, "source": source}


def unredact_lock(recorded: dict[str, Any] | None, inventory: dict[str, Any] | None
                  ) -> dict[str, Any] | None:  # fmt: skip
    """The recorded lock, with the inventory lock's source when that is the same source with
    its credentials (lock ids leave the source out, so the env is the same)."""
    if not isinstance(recorded, dict) or not isinstance(inventory, dict):
        return recorded
    if redact_lock(inventory).get("source") == recorded.get("source") != inventory.get("source"):
        return {**recorded, "source": inventory["source"]}
    return recorded


class FilterModule:
    def filters(self) -> dict:
        return {"dflash_redact_env_lock": redact_lock, "dflash_unredact_env_lock": unredact_lock}
