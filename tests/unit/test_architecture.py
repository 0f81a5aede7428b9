"""Import contracts: docs/ARCHITECTURE.md's "may import" table, checked on the installed package.

Every import counts, at module level or inside a function: a function-level import of Textual in
the telemetry would still put Textual in the daemon.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vsup

PACKAGE = Path(vsup.__file__).parent

# area -> the vsup areas it may import besides itself and the leaf modules (snapshot, clock,
# paths and other top-level single modules, which import no other area). "*" = any area.
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
    "bench": {"layout", "control.client", "control.errors", "commands.progress"},
    "fleet": {"control.errors", "layout.model"},
    "pull": {"layout"},
    "cli": {"*"},
    "__main__": {"cli"},
}
# areas that must run without a terminal UI library loaded (the daemon imports them)
NO_UI = {"layout", "telemetry", "engine", "control", "router", "fleet", "pull"}
UI_LIBRARIES = {"textual", "rich"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of everything `path` imports (`from a import b` gives a.b when b is a
    module of ours, else a)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if is_our_module(sub) else target)
    return out


def is_our_module(name: str) -> bool:
    if not name.startswith("vsup"):
        return False
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


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


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_is_scanned_from_the_installed_copy():
    assert "site-packages" in PACKAGE.parts
    assert len(modules()) > 50


@pytest.mark.parametrize("path", modules(), ids=lambda p: module_name(p))
def test_module_imports_only_what_its_area_may(path: Path):
    name = module_name(path)
    area = area_of(name) or name.rpartition(".")[2]
    bad = []
    for target in sorted(imports_of(path)):
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
    fake = PACKAGE / "telemetry" / "metrics.py"
    names = imports_of(fake)
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
