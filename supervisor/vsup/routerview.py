"""The router's status (`status --json`'s `router` object) as one line of text, for `vsup
status` and the dashboard. Pure: plain dicts in, text out."""

from __future__ import annotations

from typing import Any

from vsup.states import State


def _rate(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def worker_marks(router: dict[str, Any]) -> str:
    """`a 50%, b 50%, c out`: each member's share of the router's requests so far, or why it
    gets none now (out: not in the router's set; its state when that says why)."""
    parts = []
    for w in router.get("workers") or ():
        if w.get("in_router") is False or (w.get("in_router") is None and not w.get("wanted")):
            state = w.get("state")
            why = state if state and state != State.READY else "out"
            parts.append(f"{w['name']} {why}")
        elif w.get("share") is not None:
            parts.append(f"{w['name']} {w['share']:.0%}")
        else:
            parts.append(str(w["name"]))
    return ", ".join(parts) or "no workers"


def router_line(router: dict[str, Any] | None) -> str | None:
    """One line: endpoint, state, rates and workers; None without a router."""
    if not router:
        return None
    state = router.get("state", "?")
    line = (
        f"router {router.get('endpoint')} {state} · {_rate(router.get('requests_per_s'))} req/s · "
        f"{_rate(router.get('errors_per_s'))} err/s · workers: {worker_marks(router)}"
    )
    if router.get("error"):
        line += f" · {router['error'][:120]}"
    if state == State.FAILED and router.get("failed_why"):
        line += f" · {router['failed_why'][:160]}"
    return line
