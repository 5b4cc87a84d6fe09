"""The toolkit's import graph as a plain tool sees it: each import resolved against the
repository's root only (as pyright, IDEs and import-graph tools do without Ansible's loaders).

    .venv/bin/python bench/import_graph.py [--repo DIR]

Prints the edges between the repository's own files, the layers (the longest chain of imports
below a file), the cycles, and the files tied to nothing, for the toolkit's folders and the
trainer apart (tests and bench left out). Run it on an old checkout (`git worktree add`) for a
before and after."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

FOLDERS = (
    "ansible_collections", "library", "filter_plugins", "action_plugins", "callback_plugins",
    "connection_plugins", "doc_fragments", "module_utils", "dflash",
)  # fmt: skip


def sources(repo: Path) -> list[Path]:
    return sorted(
        path.relative_to(repo)
        for folder in FOLDERS
        if (repo / folder).is_dir()
        for path in (repo / folder).rglob("*.py")
    )


def resolve(repo: Path, dotted: str) -> Path | None:
    base = repo.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(repo)
    return None


def imports(repo: Path, path: Path) -> set[Path]:
    found = set()
    for node in ast.walk(ast.parse((repo / path).read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            target = resolve(repo, name)
            if target is not None and target != path:
                found.add(target)
    return found


def cycles(graph: dict[Path, set[Path]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one file."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    out = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(str(member))
                if member == node:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return out


def layers(graph: dict[Path, set[Path]]) -> int:
    depth: dict[Path, int] = {}

    def of(node: Path, seen: frozenset) -> int:
        if node not in depth:
            below = [of(n, seen | {node}) for n in graph.get(node, ()) if n not in seen]
            depth[node] = 1 + max(below, default=0)
        return depth[node]

    return max((of(node, frozenset()) for node in graph), default=0)


def summary(repo: Path, files: list[Path]) -> dict:
    graph = {path: imports(repo, path) & set(files) for path in files}
    tied = {path for path, targets in graph.items() if targets} | set().union(*graph.values())
    return {
        "files": len(files),
        "edges": sum(len(targets) for targets in graph.values()),
        "layers": layers(graph),
        "cycles": cycles(graph),
        "tied_to_nothing": sorted(str(path) for path in files if path not in tied),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    files = sources(args.repo)
    toolkit = [path for path in files if path.parts[0] != "dflash"]
    trainer = [path for path in files if path.parts[0] == "dflash"]
    print(json.dumps({"toolkit": summary(args.repo, toolkit),
                      "trainer": summary(args.repo, trainer)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
