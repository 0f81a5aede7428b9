"""States and exit reasons are compared with the enums' members (vsup.states), never with string
literals: a typo in `inst.state == "redy"` is always False and nothing would say so, while
`State.REDY` fails at once. Checked on the installed package, every module.

What counts as a state: an expression ending in `.state`, `.reason` or `.rollout`, a variable
named `state`, `reason` or `*_state`, a JSON document's `["state"]` / `.get("state")` (the same
names read back from the status JSON: a StrEnum member equals its string, so the comparison still
works), and a lookup by any key in a mapping named `states` or `*_states` (`states.get(n)`,
`states[n]`: how a command reads every instance's state at once).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vsup

PACKAGE = Path(vsup.__file__).parent
WORDS = ("state", "reason", "rollout")
MAPPINGS = ("states",)  # name -> state


def _mapping(node: ast.expr) -> str | None:
    """`states` of `states.get(n)` or `states[n]` (a key that is not a literal string)."""
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and not isinstance(node.args[0], ast.Constant)
    ):
        return _name(node.func.value)
    return None


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value if isinstance(node.slice.value, str) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def names_a_state(node: ast.expr) -> bool:
    name = _name(node)
    if name is not None and any(name == w or name.endswith("_" + w) for w in WORDS):
        return True
    held = _mapping(node)
    return held is not None and any(held == m or held.endswith("_" + m) for m in MAPPINGS)


def is_string_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    return False


def literal_comparisons(source: str, filename: str = "<test>") -> list[str]:
    """`line: expression` of every comparison of a state with a string literal in `source`."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names_a_state(s) for s in sides) and any(is_string_literal(s) for s in sides):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_the_check_finds_each_shape_of_a_state_compared_with_a_literal():
    bad = """
inst.state == "ready"
lc.state not in ("stopped", "failed")
state != "backoff"
i["state"] == "ready"
router.get("state") == "failed"
last.reason == "stopped"
old_state in ["ready"]
states.get(n) != "ready"
all_states[name] == "stopped"
v.rollout != "done"
"""
    good = """
inst.state == State.READY
inst.state in IDLE
kind == "spawn"
inst.state is None
states.get(n) == State.READY
states.get("note") == "x"
"""
    assert len(literal_comparisons(bad)) == 10
    assert literal_comparisons(good) == []


def test_no_module_compares_a_state_with_a_string_literal():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        found += [f"{rel}:{hit}" for hit in literal_comparisons(path.read_text(), str(path))]
    assert len(list(PACKAGE.rglob("*.py"))) > 50
    assert not found, "compare with vsup.states' members instead:\n" + "\n".join(found)
