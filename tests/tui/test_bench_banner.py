"""While `vsup bench` runs, the dashboard says so: a BENCH mark in the header and one line with
the layout, the phase, the requests done and the time; both go when the bench is over."""

from __future__ import annotations

from vsup.snapshot import StatusSnapshot
from vsup.tui.widgets.benchbar import BenchBar
from vsup.tui.widgets.header import NodeHeader

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

BENCH = {
    "pid": 4242,
    "phase": "running",
    "layout": "two-per-gpu",
    "index": 2,
    "count": 3,
    "requests_done": 412,
    "requests_total": 1000,
    "elapsed_s": 72.4,
    "started_at": "2026-12-01T04:00:00Z",
    "age_s": 0.4,
}


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


def with_bench(bench: dict | None) -> StatusSnapshot:
    """A status JSON document as the daemon answers it, with `bench`, parsed as the app does."""
    doc = samples.gpu_node().to_json()
    doc["bench"] = bench
    return StatusSnapshot.from_json(doc)


async def test_a_running_bench_shows_in_the_header_and_its_own_line_then_goes():
    client = make_client(with_bench(BENCH), as_json=True)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        bar = app.screen.query_one(BenchBar)
        assert bar.display and bar.has_class("-shown")
        line = _plain(bar)
        assert line.startswith("◆ bench 2/3 'two-per-gpu': running 412/1000 requests ")
        assert "1m12s" in line and "pid 4242" in line and "restores it" in line
        assert bar.region.height == 1 and bar.region.y == 1  # right under the header
        assert "BENCH 2/3" in _plain(app.screen.query_one(NodeHeader))

        # the restore: no layout index, the original's name
        client.snapshot = with_bench(
            {**BENCH, "phase": "restoring", "layout": "orig", "index": None, "count": None,
             "requests_done": None, "requests_total": None, "elapsed_s": 5.0}
        )  # fmt: skip
        app.tick()
        await settle(pilot, lambda: "restoring" in _plain(bar))
        assert _plain(bar).startswith("◆ bench: restoring the original layout 'orig' 5s")
        assert "requests" not in _plain(bar)

        # the bench ended (or its client died and the daemon dropped it): both go
        client.snapshot = with_bench(None)
        app.tick()
        await settle(pilot, lambda: not bar.has_class("-shown"))
        assert not bar.display or bar.region.height == 0
        assert "BENCH" not in _plain(app.screen.query_one(NodeHeader))


async def test_the_bench_line_fits_a_narrow_terminal_on_one_line():
    client = make_client(with_bench({**BENCH, "phase": "waiting_ready", "elapsed_s": 31.0}))
    app = make_app(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        bar = app.screen.query_one(BenchBar)
        await settle(pilot, lambda: bar.region.height == 1)
        assert _plain(bar).startswith("◆ bench 2/3 'two-per-gpu': waiting until its instances")
        assert "BENCH 2/3" in _plain(app.screen.query_one(NodeHeader))


async def test_a_tune_shows_as_a_tune_not_a_bench():
    """`vsup tune` reports through the bench's route with tool "tune": the operator reads what
    really replaced the layout (its candidates), and which command restores it."""
    client = make_client(
        with_bench({**BENCH, "layout": "orig-mns8", "tool": "tune", "eta_s": 750.0})
    )
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        line = _plain(app.screen.query_one(BenchBar))
        assert line.startswith("◆ tune 2/3 'orig-mns8': running 412/1000 requests "), line
        assert "vsup tune (pid 4242) replaced the running layout" in line
        assert "1m12s · ~12m30s left · vsup tune" in line  # the whole tune's ETA
        header = _plain(app.screen.query_one(NodeHeader))
        assert "TUNE 2/3" in header and "BENCH" not in header
