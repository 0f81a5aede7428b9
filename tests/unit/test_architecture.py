"""Import contracts: docs/ARCHITECTURE.md's "may import" table, checked on the installed package.

Every import counts, at module level or inside a function: a function-level import of Textual in
the telemetry would still put Textual in the daemon.
"""

from __future__ import annotations

import pytest

from tests.importgraph import PACKAGE, imports_of, modules

# area -> the vsup areas it may import besides itself and the leaf modules (snapshot, clock,
# paths, diagnostics and other top-level single modules, which import no other area). "*" = any
# area. (The fleet file's validation reports with the layout's Diagnostic: it lives in the leaf
# vsup.diagnostics, so fleet needs no layout import for it and this table did not grow.)
MAY_IMPORT: dict[str, set[str]] = {
    "layout": set(),
    # layout.node: the NodeFacts value telemetry.gpu.node_facts() hands to validation
    "telemetry": {"layout.spec", "layout.node"},
    "engine": {"layout.spec", "telemetry", "router"},
    "control": {"layout", "telemetry", "engine", "router", "pull"},
    "tui": {"control.client", "layout", "fleet"},
    "commands": {"*"},
    "demo": {"layout"},
    "router": {"layout", "telemetry.promtext"},
    "bench": {"layout", "control.client", "control.errors", "progress"},
    # vsup tune: candidates, search and reports on the bench's runner (docs/tune.md)
    "tune": {"layout", "bench", "control.errors", "progress"},
    "fleet": {"control.errors", "layout.model"},
    "pull": {"layout"},
    # the live line of a command that waits (CLI, bench, tune): it asks the daemon's client
    "progress": {"control.errors", "control.client"},
    "cli": {"*"},
    "__main__": {"cli"},
}
# areas that must run without a terminal UI library loaded (the daemon imports them)
NO_UI = {"layout", "telemetry", "engine", "control", "router", "fleet", "pull"}
UI_LIBRARIES = {"textual", "rich"}


def area_of(name: str) -> str:
    """`vsup.engine.runner` -> `engine`; a top-level module is its own area."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_leaf(area: str) -> bool:
    """A top-level single module (snapshot, clock, paths, ...), not a package or the CLI."""
    return (PACKAGE / f"{area}.py").is_file() and area not in MAY_IMPORT


def allowed(source_area: str, target: str) -> bool:
    target_area = area_of(target)
    if target_area in ("", source_area) or is_leaf(target_area):
        return True
    rules = MAY_IMPORT.get(source_area, set())
    if "*" in rules:
        return True
    rel = target.split(".", 1)[1]
    return any(rel == r or rel.startswith(r + ".") for r in rules)


def test_the_package_is_scanned_from_the_installed_copy():
    assert "site-packages" in PACKAGE.parts
    assert len(modules()) > 50


@pytest.mark.parametrize("name", list(modules()))
def test_module_imports_only_what_its_area_may(name: str):
    area = area_of(name) or name.rpartition(".")[2]
    bad = []
    for target in sorted(imports_of(name)):
        top = target.split(".")[0]
        if top == "vsup" and not allowed(area, target):
            bad.append(f"{target} (area {area!r} may import {sorted(MAY_IMPORT.get(area, []))})")
        if top in UI_LIBRARIES and area in NO_UI:
            bad.append(f"{target} (the {area} code never imports a UI library)")
        target_area = area_of(target)
        leaf_reach = target_area not in ("", area) and not is_leaf(target_area)
        if is_leaf(area) and top == "vsup" and leaf_reach:
            bad.append(f"{target} (a leaf module imports no package of vsup)")
    assert not bad, f"{name} imports " + "; ".join(bad)


def test_the_contract_catches_a_forbidden_import():
    """The checker itself: a telemetry module importing textual and the engine is flagged."""
    names = imports_of("vsup.telemetry.metrics")
    assert all(allowed("telemetry", n) for n in names if n.startswith("vsup"))
    assert not allowed("telemetry", "vsup.engine.engine")
    assert not allowed("engine", "vsup.control.daemon")
    assert not allowed("tui", "vsup.engine.engine")
    assert not allowed("layout", "vsup.telemetry.metrics")
    assert not allowed("layout", "vsup.telemetry.gpu")  # node facts are handed in, not probed
    assert allowed("telemetry", "vsup.layout.node")
    assert not allowed("telemetry", "vsup.layout.validate")
    assert allowed("tui", "vsup.control.client")
    assert allowed("engine", "vsup.snapshot")
    assert allowed("fleet", "vsup.diagnostics")  # a leaf: the one Diagnostic
    assert not allowed("fleet", "vsup.layout.diagnostics")  # would load the layout package
