"""While the daemon pulls a hub model, the dashboard says so: a PULL mark with the share done
in the header, a line with the bytes, rate and ETA, and `⇣ pulling` on each waiting instance's
row; a pull that failed shows PULL FAILED, its reason on the line and `✖ pull failed` rows."""

from __future__ import annotations

import dataclasses

from vsup.snapshot import PullStatus, StatusSnapshot
from vsup.tui.widgets.header import NodeHeader
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.pullbar import PullBar

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

GiB = 2**30
PULLING = PullStatus(
    model="meta-llama/Llama-3.1-8B-Instruct",
    revision="main",
    state="pulling",
    instances=("gpu0", "gpu1"),
    bytes_done=6 * GiB,
    bytes_total=15 * GiB,
    files_done=3,
    files_total=8,
    rate_bps=120 * 2**20,
    eta_s=77.0,
    current=("model-00002-of-00004.safetensors",),
)


def with_pull(pull: PullStatus | None) -> StatusSnapshot:
    """A status JSON document with the pull on `pulls` and on its instances (now stopped), as
    the daemon answers it, parsed as the app does."""
    snap = samples.gpu_node()
    if pull is not None:
        insts = tuple(
            i.with_wire(state="stopped", pid=None, pull=pull) if i.name in pull.instances else i
            for i in snap.instances
        )
        snap = dataclasses.replace(snap, instances=insts, pulls=(pull,))
    return StatusSnapshot.from_json(snap.to_json())


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


def _state_cell(table: InstanceTable, name: str) -> str:
    return table.get_cell(name, "state").plain


async def test_a_pull_shows_in_the_header_its_line_and_the_waiting_rows_then_goes():
    client = make_client(with_pull(PULLING), as_json=True)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        bar = app.screen.query_one(PullBar)
        assert bar.has_class("-shown") and bar.region.height == 1
        line = _plain(bar)
        assert line.startswith("⇣ pulling meta-llama/Llama-3.1-8B-Instruct for gpu0, gpu1: ")
        assert "6.0 GiB/15.0 GiB (40%)" in line and "120 MiB/s" in line and "ETA 1m17s" in line
        assert "3/8 files" in line
        assert "PULL 40%" in _plain(app.screen.query_one(NodeHeader))
        table = app.screen.query_one(InstanceTable)
        assert _state_cell(table, "gpu0") == "⇣ pulling 40%"
        assert _state_cell(table, "gpu1") == "⇣ pulling 40%"

        failed = dataclasses.replace(
            PULLING,
            state="failed",
            reason="no_space",
            message="9.0 GiB more free space is needed in /data/hf",
            rate_bps=None,
            eta_s=None,
        )
        client.snapshot = with_pull(failed)
        app.tick()
        await settle(pilot, lambda: "failed" in _plain(bar))
        assert _plain(bar).startswith(
            "✖ pull of meta-llama/Llama-3.1-8B-Instruct failed (no_space): 9.0 GiB more free"
        )
        assert bar.has_class("-failed")
        assert "PULL FAILED" in _plain(app.screen.query_one(NodeHeader))
        assert _state_cell(table, "gpu0") == "✖ pull failed"

        client.snapshot = with_pull(None)
        app.tick()
        await settle(pilot, lambda: not bar.has_class("-shown"))
        assert "PULL" not in _plain(app.screen.query_one(NodeHeader))


async def test_the_pull_line_fits_a_narrow_terminal():
    client = make_client(with_pull(PULLING))
    app = make_app(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        bar = app.screen.query_one(PullBar)
        await settle(pilot, lambda: bar.region.height == 1)
        assert _plain(bar).startswith("⇣ pulling meta-llama/Llama-3.1-8B-Instruct")
