"""Find the Debian mirror that apt already uses, so the repository never names one."""

from __future__ import annotations

from pathlib import Path

APT_DIR = Path("/etc/apt")


def _deb822_entries(text: str) -> list[dict[str, str]]:
    """Parse the stanzas of a deb822 .sources file (blank-line separated, `Key: value`)."""
    entries: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = ""
    for raw in [*text.splitlines(), ""]:
        line = raw.rstrip()
        if line.startswith("#"):
            continue
        if not line:
            if current:
                entries.append(current)
            current, key = {}, ""
        elif line[0] in " \t" and key:
            current[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            current[key] = value.strip()
    return entries


def _one_line_entries(text: str) -> list[dict[str, str]]:
    """Parse classic `deb [opts] URI SUITE COMPONENTS...` lines into deb822-like dicts."""
    entries = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        if words[1].startswith("["):
            while words and not words[1].endswith("]"):
                words.pop(1)
            words.pop(1)
        if len(words) >= 3:
            entries.append({"types": "deb", "uris": words[1], "suites": words[2]})
    return entries


def debian_mirror(suite: str = "bookworm", apt_dir: Path = APT_DIR) -> str:
    """Return the URI of the first enabled `deb` source that carries `suite` itself."""
    entries: list[dict[str, str]] = []
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        entries += _deb822_entries(path.read_text(encoding="utf-8", errors="replace"))
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if path.is_file():
            entries += _one_line_entries(path.read_text(encoding="utf-8", errors="replace"))
    for entry in entries:
        if entry.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in entry.get("types", "").split():
            continue
        if suite in entry.get("suites", "").split() and entry.get("uris"):
            return entry["uris"].split()[0]
    raise LookupError(f"no apt source for Debian {suite!r} under {apt_dir}; debootstrap needs one")
