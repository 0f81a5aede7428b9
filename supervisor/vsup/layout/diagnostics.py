"""What validation says about a layout: one `Diagnostic` per problem, errors and warnings.

A diagnostic names the file (and line, where one can be found), the instance and the key, and
its message says what to change. `vsup validate` prints them one per line:
`FILE:LINE: error: instance 'gpu0': key 'port': ...`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

ERROR = "error"
WARNING = "warning"
# How many further instances a folded diagnostic names before "and N more".
SHOWN_OTHERS = 4


@dataclass(frozen=True)
class Diagnostic:
    severity: str  # "error" | "warning"
    message: str  # what is wrong and what to change
    file: str | None = None  # the layout or profile file the problem is in
    line: int | None = None  # 1-based, where the source text shows it
    instance: str | None = None  # the instance it concerns, if one
    key: str | None = None  # dotted key inside its table, e.g. "args.max-model-len"
    table: str | None = None  # "[layout]", "[defaults]", "profile 'x'" when not an instance
    others: tuple[str, ...] = ()  # further instances with the very same problem

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def format(self) -> str:
        """One line: `FILE:LINE: error: instance 'gpu0': key 'port': message`."""
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        parts = [f"{where}{self.severity}"]
        if self.instance is not None:
            label = f"instance '{self.instance}'"
            if self.others:
                shown = ", ".join(f"'{o}'" for o in self.others[:SHOWN_OTHERS])
                more = len(self.others) - SHOWN_OTHERS
                label += f" (and {shown}" + (f" and {more} more)" if more > 0 else ")")
            parts.append(label)
        elif self.table:
            parts.append(self.table)
        if self.key:
            parts.append(f"key '{self.key}'")
        parts.append(self.message)
        return ": ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "instance": self.instance,
            "key": self.key,
            "table": self.table,
            "others": list(self.others),
            "text": self.format(),
        }

    def __str__(self) -> str:
        return self.format()


class LayoutError(ValueError):
    """A layout that cannot be used; `diagnostics` holds every error (and the warnings)."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        shown = errors or list(self.diagnostics)
        super().__init__("\n".join(d.format() for d in shown) or "invalid layout")

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.is_error)


def merge_repeats(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Fold diagnostics that differ only by instance into one naming them all.

    A bad value in `[defaults]` or a profile concerns every instance; saying so once, with the
    instances listed, keeps 64 identical lines out of the operator's way.
    """
    out: list[Diagnostic] = []
    index: dict[tuple, int] = {}
    for d in diagnostics:
        if d.instance is None:
            key = (d.severity, d.file, d.line, d.key, d.table, d.message, None)
            if key in index:
                continue
            index[key] = len(out)
            out.append(d)
            continue
        key = (d.severity, d.file, d.line, d.key, d.table, d.message, "instance")
        if key in index:
            first = out[index[key]]
            names = (*first.others, d.instance, *d.others)
            out[index[key]] = replace(first, others=tuple(dict.fromkeys(names)))
        else:
            index[key] = len(out)
            out.append(d)
    return out


def sort_key(d: Diagnostic) -> tuple:
    """Errors first, then by file and line, keeping the order rules produced them otherwise."""
    return (0 if d.is_error else 1, d.file or "", d.line or 0)
