"""No import cycle inside vsup: a module graph built with `ast` from the installed package.

Edges are a module's module-level imports (inside `try`, `if` and `if TYPE_CHECKING:` blocks
too: a cycle through type-only imports still knots the design; imports inside functions are
not edges). Importing `vsup.a.b` also runs `vsup/a/__init__.py`, so that package is an edge
too, unless the importer lives inside it (then it is already being imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vsup

# Import edges allowed to close a cycle: none. The last two (engine.runner -> engine.engine and
# tui.screens.dashboard -> tui.app, both under TYPE_CHECKING) went with issue 13's engine and
# dashboard changes. An edge put here must still exist (test_known_edges_are_still_needed).
KNOWN_EDGES: set[tuple[str, str]] = set()


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _module_level_imports(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            yield from _module_level_imports(node.body)
            yield from _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level_imports(block)
            for handler in node.handlers:
                yield from _module_level_imports(handler.body)
        elif isinstance(node, ast.With):
            yield from _module_level_imports(node.body)


def import_graph() -> dict[str, set[str]]:
    root = Path(vsup.__file__).parent
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in _module_level_imports(ast.parse(path.read_text(), str(path)).body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base]
                # `from vsup.x import y` imports the module vsup.x.y when there is one.
                targets += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            for target in targets:
                if not target.startswith("vsup"):
                    continue
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    dep = ".".join(parts[:i])
                    inside = name == dep or name.startswith(dep + ".")
                    if dep in modules and dep != name and not inside:
                        graph[name].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_graph_sees_the_imports_it_must():
    graph = import_graph()
    assert "vsup.layout.model" in graph["vsup.layout.validate"]
    assert "vsup.engine" in graph["vsup.control.daemon"]  # the package __init__ runs too
    assert "vsup.layout.validate" not in graph["vsup.layout.model"]  # function-level only


def test_known_edges_are_still_needed():
    graph = import_graph()
    gone = [edge for edge in KNOWN_EDGES if edge[1] not in graph.get(edge[0], set())]
    assert not gone, f"remove from KNOWN_EDGES, the import is gone: {gone}"


def test_no_import_cycle_in_vsup():
    graph = import_graph()
    for a, b in KNOWN_EDGES:
        graph.get(a, set()).discard(b)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_in_the_layout_package_even_through_function_imports():
    """The layout package is layered (structure -> merge -> rules -> resolve/store): no module
    reaches up, even inside a function, except Layout.resolve's one documented late import."""
    root = Path(vsup.__file__).parent
    allowed = {("vsup.layout.model", "vsup.layout.resolve")}
    graph = import_graph()
    modules = _modules(root)
    for name, path in modules.items():
        if not name.startswith("vsup.layout"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vsup.layout"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    dep = sub if sub in modules else node.module
                    if not name.startswith(dep + "."):  # a package of its own: already running
                        graph[name].add(dep)
    for edge in allowed:
        graph[edge[0]].discard(edge[1])
    layout_graph = {k: {d for d in v if d.startswith("vsup.layout")} for k, v in graph.items()}
    cycle = find_cycle({k: v for k, v in layout_graph.items() if k.startswith("vsup.layout")})
    assert cycle is None, "import cycle (function-level imports included): " + " -> ".join(cycle)
