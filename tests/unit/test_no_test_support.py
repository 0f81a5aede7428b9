"""Test support lives in tests/support and never ships in vsup's wheel (issue 37): the
installed package holds no test-only module and no class that exists only for tests."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import vsup

# what moved out of the package into tests/support (tests and benchmarks import it from there)
FORBIDDEN_MODULES = ("vsup.tui.samples", "vsup.tui.memory")
# test doubles by name: a class so named in the package is test support shipped to users
FORBIDDEN_CLASS_PREFIXES = ("Fake", "Stub", "Mock")
FORBIDDEN_CLASSES = ("MemoryClient",)


ROOT = Path(vsup.__file__).parent


def test_test_support_modules_are_not_installed() -> None:
    shipped = [m for m in FORBIDDEN_MODULES if importlib.util.find_spec(m) is not None]
    assert shipped == [], f"test support in the installed package: {shipped}"


def test_no_test_double_class_in_the_installed_package() -> None:
    sources = sorted(ROOT.rglob("*.py"))
    assert sources, "no installed vsup sources found"
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (
                node.name.startswith(FORBIDDEN_CLASS_PREFIXES) or node.name in FORBIDDEN_CLASSES
            ):
                found.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert found == [], f"test doubles shipped in the package: {found}"
