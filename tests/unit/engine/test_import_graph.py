"""The engine's modules import one another without a cycle (issue 13): the runner and the
teardown see the engine only through host.RunnerHost, never engine.py."""

from __future__ import annotations

import ast
from pathlib import Path

import vsup.engine

PKG = "vsup.engine"


def engine_imports() -> dict[str, set[str]]:
    """module -> the vsup.engine modules it imports (anywhere in it, TYPE_CHECKING included)."""
    root = Path(vsup.engine.__path__[0])
    names = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((root / f"{name}.py").read_text())
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == PKG:
                    deps |= {a.name for a in node.names if a.name in names}
                elif node.module.startswith(PKG + "."):
                    deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith(PKG + "."):
                        deps.add(a.name.split(".")[2])
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_engine_package_has_no_import_cycle():
    graph = engine_imports()
    assert {"engine", "runner", "host", "teardown", "instance", "states"} <= set(graph)
    assert cycles(graph) == []


def test_the_runner_knows_the_engine_only_through_its_host_interface():
    graph = engine_imports()
    for module in ("runner", "teardown", "host", "instance"):
        assert "engine" not in graph[module], module
    assert graph["states"] <= set(), "states.py is a leaf"


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
