"""What validation says about a layout: one `Diagnostic` per problem, errors and warnings.

A diagnostic names the file (and line, where one can be found), the instance and the key, and
its message says what to change. `vsup validate` prints them one per line:
`FILE:LINE: error: instance 'gpu0': key 'port': ...`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

# Diagnostic lives in the leaf vsup.diagnostics (the fleet file's validation reports with it
# too); its names stay importable from here, where the layout's rules take them.
from vsup.diagnostics import ERROR, SHOWN_OTHERS, WARNING, Diagnostic

__all__ = [
    "ERROR",
    "SHOWN_OTHERS",
    "WARNING",
    "Diagnostic",
    "LayoutError",
    "merge_repeats",
    "sort_key",
]


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
    # (severity, file, line, key, table, message, scope): scope None for a layout-wide
    # diagnostic, "instance" for one that folds across instances
    index: dict[tuple[str | int | None, ...], int] = {}
    key: tuple[str | int | None, ...]
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
