"""The engine's modules import one another without a cycle (issue 13): the runner and the
teardown see the engine only through host.RunnerHost, never engine.py."""

from __future__ import annotations

from tests.importgraph import cycles, import_graph, within

PKG = "vsup.engine"


def engine_imports() -> dict[str, set[str]]:
    """module -> the vsup.engine modules it imports (anywhere in it, TYPE_CHECKING included),
    both by their short names (`runner`)."""
    graph = within(import_graph(module_level_only=False), PKG)
    short = {name: name.removeprefix(PKG + ".") for name in graph}
    return {short[k]: {short[d] for d in v} for k, v in graph.items() if k != PKG}


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
