"""Rules about the layout as a whole."""

from __future__ import annotations

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.rules.context import Context
from vsup.layout.structure import instance_tables


def no_instances(ctx: Context) -> list[Diagnostic]:
    """A layout without instances stops everything that runs when applied: an empty or cut
    file must not do that silently, so it has to say `[layout] empty = true`."""
    layout = ctx.layout
    count = sum(1 for _ in instance_tables(layout))
    line = layout.source_map.line(("layout", "empty")) if layout.source else None
    if count == 0 and not layout.empty_ok:
        return [
            Diagnostic(
                ERROR,
                "the layout has no [[instance]]: applying it would stop every instance that "
                "runs; add [[instance]] tables, or set empty = true in [layout] if that is meant",
                file=layout.file,
                table="[layout]",
            )
        ]
    if count and layout.empty_ok:
        return [
            Diagnostic(
                WARNING,
                f"empty = true, but the layout has {count} instance{'s' if count != 1 else ''}: "
                "remove empty",
                file=layout.file,
                line=line,
                table="[layout]",
                key="empty",
            )
        ]
    return []
