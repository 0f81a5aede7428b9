"""Rules for a rolling apply's canary (`[layout] canary_s`, `canary`, `canary_*`;
docs/canary.md). The keys' types and ranges are the schema's (`CANARY_KEYS`); these look at
them together."""

from __future__ import annotations

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.rules.context import Context
from vsup.layout.schema import CANARY_KEYS, is_number
from vsup.layout.structure import Where

_THRESHOLDS = tuple(k.name for k in CANARY_KEYS if k.name != "canary_s")


def canary_keys_without_watch(ctx: Context) -> list[Diagnostic]:
    """`canary` or a `canary_*` threshold without `canary_s` (or with 0): no canary runs, so
    the key does nothing - most likely `canary_s` was forgotten."""
    header = ctx.layout.header
    watch = header.get("canary_s", 0)
    if not is_number(watch) or watch > 0:
        return []
    w = Where(ctx.layout.file, ctx.layout.source_map, ("layout",), table="[layout]")
    return [
        w.diag(
            WARNING,
            "has no effect without a canary: set canary_s = N (seconds the first wave is "
            "watched) to have one",
            key,
            (key,),
        )
        for key in _THRESHOLDS
        if key in header
    ]


def canary_max_below_watch(ctx: Context) -> list[Diagnostic]:
    """`canary_max_s` (the longest an `extend` watch lasts) shorter than `canary_s`."""
    header = ctx.layout.header
    watch, most = header.get("canary_s"), header.get("canary_max_s")
    if not (is_number(watch) and is_number(most)) or most >= watch:
        return []
    w = Where(ctx.layout.file, ctx.layout.source_map, ("layout",), table="[layout]")
    return [
        w.diag(
            ERROR,
            f"is {most:g} s, shorter than canary_s ({watch:g} s): it is the longest a watch "
            "extended for lack of requests may last; make it canary_s or more",
            "canary_max_s",
            ("canary_max_s",),
        )
    ]


def canary_warmup_not_below_watch(ctx: Context) -> list[Diagnostic]:
    """`canary_warmup_s` as long as `canary_s` or longer: no latency would ever be compared."""
    header = ctx.layout.header
    watch, warmup = header.get("canary_s"), header.get("canary_warmup_s")
    if not (is_number(watch) and is_number(warmup)) or watch <= 0 or warmup < watch:
        return []
    w = Where(ctx.layout.file, ctx.layout.source_map, ("layout",), table="[layout]")
    return [
        w.diag(
            ERROR,
            f"is {warmup:g} s, not shorter than canary_s ({watch:g} s): latencies are compared "
            "only after the warm-up, within the watch; make it shorter than canary_s",
            "canary_warmup_s",
            ("canary_warmup_s",),
        )
    ]
