"""No import cycle inside vsup: a module graph built with `ast` from the installed package.

Edges are a module's module-level imports (inside `try`, `if` and `if TYPE_CHECKING:` blocks
too: a cycle through type-only imports still knots the design; imports inside functions are
not edges). Importing `vsup.a.b` also runs `vsup/a/__init__.py`, so that package is an edge
too, unless the importer lives inside it (then it is already being imported).
"""

from __future__ import annotations

from tests.importgraph import find_cycle, import_graph, within

# Import edges allowed to close a cycle: none. The last two (engine.runner -> engine.engine and
# tui.screens.dashboard -> tui.app, both under TYPE_CHECKING) went with issue 13's engine and
# dashboard changes. An edge put here must still exist (test_known_edges_are_still_needed).
KNOWN_EDGES: set[tuple[str, str]] = set()


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
    allowed = {("vsup.layout.model", "vsup.layout.resolve")}
    graph = import_graph(module_level_only=False)
    for edge in allowed:
        graph[edge[0]].discard(edge[1])
    cycle = find_cycle(within(graph, "vsup.layout"))
    assert cycle is None, "import cycle (function-level imports included): " + " -> ".join(
        cycle or []
    )


def test_no_command_imports_another_that_imports_it_back():
    """Commands borrow from each other lazily, inside functions; a pair that does it both ways
    (pull and up did: `compile_here` one way, `PullDisplay` the other) is one command's helpers
    living in the wrong module. Shared helpers go to `commands/cliutil.py`."""
    graph = within(import_graph(module_level_only=False), "vsup.commands")
    cycle = find_cycle(graph)
    assert cycle is None, "commands import each other: " + " -> ".join(cycle or [])
