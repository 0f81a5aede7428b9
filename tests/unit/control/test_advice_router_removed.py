"""Advice `router_worker_removed`: someone removed members from the router and vsup put them
back (control/advice.py); and the users connected to the router's port, named in both router
advice kinds."""

from __future__ import annotations

from vsup.control.advice import AdviceInputs, compute_advice
from vsup.control.alerts import ADVICE_KINDS
from vsup.layout.schema import ALERT_KINDS
from vsup.router import ForeignWorker, RemovedWorker


def removed(name: str, restores: int, users: tuple[str, ...] = ()) -> RemovedWorker:
    return RemovedWorker(
        url=f"http://127.0.0.1:80{len(name):02d}",
        name=name,
        first_seen="2026-12-01T10:00:00.000Z",
        last_seen="2026-12-01T10:00:15.000Z",
        restores=restores,
        last_seen_mono=15.0,
        router_host="127.0.0.1",
        router_port=8080,
        users=users,
    )


def test_a_removed_member_is_critical_advice_naming_it_and_who_was_connected():
    inputs = AdviceInputs(
        recent_failures={},
        removed_workers=(removed("r0", 1, ("mallory (uid 1001)",)), removed("r10", 140)),
    )
    (advice,) = compute_advice([], [], inputs)
    assert (advice.kind, advice.severity, advice.instance) == (
        "router_worker_removed",
        "critical",
        None,
    )
    text = advice.message
    assert "someone removed workers from the router on 127.0.0.1:8080" in text
    assert "r0 http://127.0.0.1:8002 (first at 2026-12-01T10:00:00.000Z, put back once)" in text
    assert "put back 140 times, last at 2026-12-01T10:00:15.000Z" in text
    assert "connected to the router's port then: mallory (uid 1001)." in text
    assert "no authentication" in text and "Requests that found no worker" in text
    assert ADVICE_KINDS["router_worker_removed"] == "router_worker_removed"
    assert "router_worker_removed" in ALERT_KINDS


def test_a_foreign_worker_names_the_users_connected_then():
    seen = ForeignWorker(
        url="http://127.0.0.1:18899",
        first_seen="2026-12-01T10:00:00.000Z",
        last_seen="2026-12-01T10:00:00.000Z",
        removals=1,
        last_seen_mono=0.0,
        router_host="127.0.0.1",
        router_port=8080,
        users=("mallory (uid 1001)", "eve (uid 1002)"),
    )
    (advice,) = compute_advice([], [], AdviceInputs(recent_failures={}, foreign_workers=(seen,)))
    assert "then: eve (uid 1002), mallory (uid 1001)." in advice.message
