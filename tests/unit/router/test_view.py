"""The router's status as text: `vsup status` (its row and line) and the dashboard header."""

from __future__ import annotations

from dataclasses import replace

from vsup.commands.status import render
from vsup.routerview import as_router, router_line
from vsup.tui.widgets.header import header_text

from tests.support.samples import cpu_node

ROUTER = {
    "state": "ready",
    "pid": 4242,
    "port": 8080,
    "endpoint": "http://node7:8080",
    "restarts": 0,
    "uptime_s": 65.0,
    "requests_per_s": 20.04,
    "errors_per_s": 0.0,
    "error": None,
    "workers": [
        {"name": "r0", "state": "ready", "in_router": True, "wanted": True, "share": 0.5},
        {"name": "r1", "state": "ready", "in_router": True, "wanted": True, "share": 0.5},
        {"name": "r2", "state": "starting", "in_router": False, "wanted": False, "share": None},
    ],
}


def test_the_line_gives_the_endpoint_rates_and_each_workers_share_or_why_it_has_none():
    assert router_line(ROUTER) == (
        "router http://node7:8080 ready · 20.0 req/s · 0.0 err/s · "
        "workers: r0 50%, r1 50%, r2 starting"
    )
    assert router_line(None) is None


def test_vsup_status_shows_the_router_as_a_row_and_a_line():
    doc = cpu_node().to_json()
    text = render({**doc, "instances": [], "router": ROUTER})
    row = next(line for line in text.splitlines() if line.startswith("(router)"))
    assert row.split()[:4] == ["(router)", "ready", "4242", "8080"]
    line = router_line(ROUTER)
    assert line is not None and line in text


def test_the_dashboard_header_names_the_endpoint_and_a_router_that_does_not_serve():
    snap = cpu_node()
    ok = header_text(replace(snap, router=as_router(ROUTER)), False, False).plain
    assert "router http://node7:8080" in ok
    down = header_text(
        replace(snap, router=as_router({**ROUTER, "state": "backoff"})), False, True
    ).plain
    assert "http://node7:8080 backoff" in down


def test_the_line_says_which_models_are_held_for_and_how_many_requests_wait():
    holders = [
        {"model": "mb", "in_router": True, "held": 3, "waking": True},
        {"model": "mc", "in_router": True, "held": 0},
        {"model": "ma", "in_router": False, "held": 0},
    ]
    line = router_line({**ROUTER, "held": 3, "holders": holders})
    assert line is not None
    assert line.endswith("· holding: mb 3 held (waking), mc 0 held"), line


def test_events_name_a_holder_by_the_model_it_holds_for():
    from types import SimpleNamespace

    from vsup.commands.events import worker_names

    status = {
        "router": {
            "workers": [{"name": "a", "url": "http://127.0.0.1:8000"}],
            "holders": [{"model": "mb", "url": "http://127.0.0.1:41491"}, {"model": "mc"}],
        }
    }
    client = SimpleNamespace(json=SimpleNamespace(status=lambda: status))
    assert worker_names(client) == {  # type: ignore[arg-type]
        "http://127.0.0.1:8000": "a",
        "http://127.0.0.1:41491": "hold mb",
    }
