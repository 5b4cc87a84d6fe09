"""Every relative link in README.md and docs/*.md points at a file that exists and, with an
anchor, at a heading of that file (GitHub's anchor rules); every docs page is linked from the
README's map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[(?:[^\]]*)\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are not links."""
    text = re.sub(r"(?ms)^( *)```.*?^\1```", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(path.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if match:
            base = slug(match[1])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(
                f"{target}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}"
            )
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    assert broken == [], f"{page.relative_to(REPO)}: broken links: {broken}"


def test_every_docs_page_is_in_the_readme_map():
    readme = set(links(REPO / "README.md"))
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert unlinked == [], f"README.md's map of docs/ lacks {unlinked}"


def test_the_link_checker_sees_a_broken_link(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n\n[ok](#a-title) [bad](#nope) `[code](nowhere.md)`\n")
    assert links(page) == ["#a-title", "#nope"]
    assert anchors(page) == {"a-title"}
    assert slug("The throughput gate, and what it cannot see on a shared host") == (
        "the-throughput-gate-and-what-it-cannot-see-on-a-shared-host"
    )
    assert slug("From Python or CI: ansible-runner") == "from-python-or-ci-ansible-runner"
