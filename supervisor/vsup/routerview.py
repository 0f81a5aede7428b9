"""The router's status (`status --json`'s `router` object) as one line of text, for `vsup
status`, `vsup up --wait` and the dashboard. Pure: a `snapshot.RouterStatus` (or its JSON
object, which is read into one) in, text out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vsup.snapshot import RouterStatus, StatusSnapshot
from vsup.states import State
from vsup.termtext import printable


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def as_router(router: RouterStatus | Mapping[str, Any] | None) -> RouterStatus | None:
    """The typed router status of either form (None without a router)."""
    if not router:
        return None
    if isinstance(router, RouterStatus):
        return router
    return StatusSnapshot.decode_part(RouterStatus, dict(router))


def worker_marks(router: RouterStatus | Mapping[str, Any]) -> str:
    """`a 50%, b 50%, c out`: each member's share of the router's requests so far, or why it
    gets none now (out: not in the router's set; its state when that says why)."""
    r = as_router(router)
    parts = []
    for w in r.workers if r is not None else ():
        name = printable(w.name)
        if w.in_router is False or (w.in_router is None and not w.wanted):
            why = w.state if w.state and w.state != State.READY else "out"
            parts.append(f"{name} {why}")
        elif w.share is not None:
            parts.append(f"{name} {w.share:.0%}")
        else:
            parts.append(name)
    return ", ".join(parts) or "no workers"


def router_line(router: RouterStatus | Mapping[str, Any] | None) -> str | None:
    """One line: endpoint, state, rates and workers; None without a router."""
    r = as_router(router)
    if r is None:
        return None
    line = (
        f"router {r.endpoint} {r.state} · {_rate(r.requests_per_s)} req/s · "
        f"{_rate(r.errors_per_s)} err/s · workers: {worker_marks(r)}"
    )
    holding = [h for h in r.holders if h.in_router or h.held]
    if holding:
        # wake on request: the models whose holder stands in now, and what it holds
        line += " · holding: " + ", ".join(
            f"{printable(h.model)} {h.held} held" + (" (waking)" if h.waking else "")
            for h in holding
        )
    if r.error:
        line += f" · {r.error[:120]}"
    if r.state == State.FAILED and r.failed_why:
        line += f" · {r.failed_why[:160]}"
    return printable(line)
