"""States and exit reasons are compared with the enums' members (vsup.states), never with string
literals: a typo in `inst.state == "redy"` is always False and nothing would say so, while
`State.REDY` fails at once. Checked on the installed package, every module.

What counts as a state: an expression ending in `.state`, `.reason` or `.rollout`, a variable
named `state`, `reason` or `*_state`, a JSON document's `["state"]` / `.get("state")` (the same
names read back from the status JSON: a StrEnum member equals its string, so the comparison still
works), and a lookup by any key in a mapping named `states` or `*_states` (`states.get(n)`,
`states[n]`: how a command reads every instance's state at once). And through any name: a literal
that spells one of `State`'s values (`current == "ready"`) is a state compared with a string,
unless the other side is named for another vocabulary that shares a word (`OTHER_WORDS`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vsup
from vsup.states import State

PACKAGE = Path(vsup.__file__).parent
STATE_WORDS = frozenset(s.value for s in State)
# names whose values are another vocabulary with words a state has too: a bench's restore
# `outcome` (`stopped`, `failed`), a wait reason's `kind` (`backoff`), a pull worker's `event`
OTHER_WORDS = ("outcome", "kind", "event")
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


def spells_a_state(node: ast.expr) -> bool:
    """A string literal (or a tuple, list or set of them) with one of `State`'s values."""
    elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return any(isinstance(e, ast.Constant) and e.value in STATE_WORDS for e in elts)


def other_vocabulary(node: ast.expr) -> bool:
    name = _name(node)
    return name is not None and any(name == w or name.endswith("_" + w) for w in OTHER_WORDS)


def literal_comparisons(source: str, filename: str = "<test>") -> list[str]:
    """`line: expression` of every comparison of a state with a string literal in `source`."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(names_a_state(s) for s in sides) and any(map(is_string_literal, sides))
            spelled = any(map(spells_a_state, sides)) and not any(map(other_vocabulary, sides))
            if named or spelled:
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
current == "ready"
inst.lifecycle.state in ("starting", "ready")
s != "stopped"
"""
    good = """
inst.state == State.READY
inst.state in IDLE
kind == "spawn"
inst.state is None
states.get(n) == State.READY
states.get("note") == "x"
outcome == "failed"
w.kind == "backoff"
"""
    assert len(literal_comparisons(bad)) == 13
    assert literal_comparisons(good) == []


def test_no_module_compares_a_state_with_a_string_literal():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        found += [f"{rel}:{hit}" for hit in literal_comparisons(path.read_text(), str(path))]
    assert len(list(PACKAGE.rglob("*.py"))) > 50
    assert not found, "compare with vsup.states' members instead:\n" + "\n".join(found)
