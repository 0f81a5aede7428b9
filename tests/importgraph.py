"""vsup's modules and their imports, read with `ast` from the installed package.

The architecture tests (tests/unit/test_architecture.py, test_import_cycles.py,
engine/test_import_graph.py) share this: the source is parsed, never imported, so a test sees
every import, including those under `if TYPE_CHECKING:` and inside functions, and what the
package would drag in when it is run is not loaded into the test process.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import vsup

# The installed copy (`make test` installs vsup non-editable), the one users run.
PACKAGE = Path(vsup.__file__).parent


@cache
def modules() -> dict[str, Path]:
    """Every module of the installed vsup by dotted name, sorted; a package is named by its
    `__init__.py` (`vsup.engine`), the top package is `vsup`."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@cache
def _tree(name: str) -> ast.Module:
    path = modules()[name]
    return ast.parse(path.read_text(), str(path))


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: at its top level, and inside `if`
    (TYPE_CHECKING too), `try` and `with` blocks there; not those in functions or classes."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level(block)
            for handler in node.handlers:
                yield from _module_level(handler.body)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)


def imports_of(name: str, *, module_level_only: bool = False) -> set[str]:
    """Absolute names of everything module `name` imports, vsup's and others' (`textual`):
    `import a.b` gives a.b; `from a import b` gives a.b when that is a module of vsup, else a.
    Relative imports are resolved. Every import counts unless `module_level_only` (then only
    those that run when the module is imported; see _module_level)."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = _tree(name)
    nodes = (
        _module_level(tree.body)
        if module_level_only
        else (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
    )
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        target = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            target = ".".join(anchor + ([target] if target else []))
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            out.add(sub if sub in modules() else target)
    return out


def import_graph(*, module_level_only: bool = True) -> dict[str, set[str]]:
    """module -> the vsup modules importing it runs (a fresh dict, the caller may edit it).

    Importing vsup.a.b also runs vsup/a/__init__.py, so each package above an imported module
    is an edge too, unless the importer lives inside it (then it is already being imported).
    By default only module-level imports are edges (what runs at import time, the imports that
    can knot into a cycle); `module_level_only=False` adds those inside functions."""
    graph: dict[str, set[str]] = {}
    for name in modules():
        deps: set[str] = set()
        for target in imports_of(name, module_level_only=module_level_only):
            if target != "vsup" and not target.startswith("vsup."):
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                inside = name == dep or name.startswith(dep + ".")
                if dep in modules() and not inside:
                    deps.add(dep)
        graph[name] = deps
    return graph


def within(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The part of `graph` inside `package` (it and its modules), edges leaving it dropped."""

    def inside(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    return {k: {d for d in v if inside(d)} for k, v in graph.items() if inside(k)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk in name order meets, each as [a, b, ..., a]: one per edge
    that closes a cycle, so an acyclic graph gives []."""
    found: list[list[str]] = []
    state: dict[str, str] = {}  # "open": on the walk's path; "done": all below it seen
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = "open"
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first of `cycles(graph)`, or None."""
    found = cycles(graph)
    return found[0] if found else None
