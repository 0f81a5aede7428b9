"""Rules about stall detection: `stall_after_s`, `canary_interval_s`, `restart.on_stall`,
and the cadence of an idle instance's scrapes, `rest_interval_s`
(telemetry/stall.py)."""

from __future__ import annotations

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.schema import is_number

# vsup reads /metrics once a second: a stall needs two readings at least to be seen.
STALL_MIN_S = 2.0
# Below this a slow scrape or one long engine step (a big prefill chunk on a loaded GPU) can
# read as a stall; with on_stall that restarts a server that was working.
STALL_SHORT_S = 10.0


def _on_stall(m: MergedInstance) -> bool:
    restart = m.values.get("restart")
    return isinstance(restart, dict) and restart.get("on_stall") is True


def stall_after_too_short(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    value = m.values.get("stall_after_s")
    if not is_number(value) or value <= 0 or value >= STALL_SHORT_S:
        return []
    if value < STALL_MIN_S:
        return [
            origin_diag(
                ERROR,
                f"stall_after_s = {value} is too short to judge: vsup reads /metrics once a "
                f"second; use {STALL_MIN_S:g} or more (the default is 60), or 0 to turn stall "
                "detection off",
                m,
                "stall_after_s",
            )
        ]
    then = (
        "restart.on_stall would then restart a server that was working"
        if _on_stall(m)
        else "the advice would then cry wolf"
    )
    return [
        origin_diag(
            WARNING,
            f"stall_after_s = {value} is short: one long engine step (a large prefill chunk) or "
            f"a slow scrape can look like a stall and {then}; use {STALL_SHORT_S:g} or more (the "
            "default is 60)",
            m,
            "stall_after_s",
        )
    ]


def on_stall_ignored(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    if not _on_stall(m):
        return []
    after = m.values.get("stall_after_s")
    if is_number(after) and after == 0:
        return [
            origin_diag(
                WARNING,
                "restart.on_stall = true does nothing while stall_after_s = 0 turns stall "
                "detection off: set stall_after_s (default 60) or remove on_stall",
                m,
                "restart",
                "on_stall",
            )
        ]
    restart = m.values.get("restart")
    if isinstance(restart, dict) and restart.get("policy") == "never":
        return [
            origin_diag(
                WARNING,
                'restart.on_stall = true with policy = "never": a stall ends the instance '
                '`failed` instead of restarting it; use policy = "on-failure" to have it '
                "restarted",
                m,
                "restart",
                "on_stall",
            )
        ]
    return []


# vsup polls once a second: a canary more often than that would be several in flight at once.
CANARY_MIN_S = 1.0


def canary_interval(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    value = m.values.get("canary_interval_s")
    if not is_number(value) or value == 0:
        return []
    if value < CANARY_MIN_S:
        return [
            origin_diag(
                ERROR,
                f"canary_interval_s = {value}: vsup polls once a second; use {CANARY_MIN_S:g} "
                "or more (every canary is a request vLLM counts), or 0 for no canary",
                m,
                "canary_interval_s",
            )
        ]
    after = m.values.get("stall_after_s")
    if is_number(after) and after == 0:
        return [
            origin_diag(
                WARNING,
                "canary_interval_s does nothing while stall_after_s = 0 turns stall detection "
                "off (a canary's deadline is stall_after_s): set stall_after_s or remove "
                "canary_interval_s",
                m,
                "canary_interval_s",
            )
        ]
    return []


# An instance at rest is scraped every rest_interval_s (telemetry/rest.py): vsup polls once a
# second, and figures older than 5 s read as unknown (telemetry/instance.py STALE_AFTER_S), so
# a rest's scrapes must come sooner than that, with a poll of slack.
REST_MIN_S = 1.0
REST_MAX_S = 4.0


def rest_interval(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    value = m.values.get("rest_interval_s")
    if not is_number(value) or value <= 0 or REST_MIN_S <= value <= REST_MAX_S:
        return []
    return [
        origin_diag(
            ERROR,
            f"rest_interval_s = {value}: use {REST_MIN_S:g} to {REST_MAX_S:g} seconds (vsup "
            "polls once a second, and figures older than 5 s read as unknown), or 0 to scrape "
            "an idle instance every second",
            m,
            "rest_interval_s",
        )
    ]
