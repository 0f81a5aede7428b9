"""The dashboard with a data-parallel instance: the SHAPE cell on its row and its ranks in the
side panel (the real app over injected snapshots)."""

from __future__ import annotations

import dataclasses

from vsup.snapshot import Parallel, RankStatus, empty_instance
from vsup.tui.widgets.detail import SidePanel
from vsup.tui.widgets.instances import InstanceTable

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

GiB = 2**30


def dp_node(dead_rank: int | None = None):
    """The sample CPU-less GPU node plus `dp8`: one vLLM server, 8 TP1 ranks on GPUs 0-7."""
    base = samples.gpu_node()
    ranks = tuple(
        RankStatus(
            rank=r,
            gpus=(r,),
            pid=41000 + r,
            alive=r != dead_rank,
            hbm_bytes=None if r == dead_rank else (60 + r) * GiB,
        )
        for r in range(8)
    )
    dp8 = empty_instance(
        "dp8",
        state="ready" if dead_rank is None else "unhealthy",
        pid=40999,
        port=9000,
        gpus=tuple(range(8)),
        model=samples.MODEL,
        parallel=Parallel(1, 1, 8),
        hbm_per_gpu={str(r): (60 + r) * GiB for r in range(8)},
        ranks=ranks,
    )
    others = tuple(dataclasses.replace(i, parallel=Parallel(1, 1, 1)) for i in base.instances)
    return dataclasses.replace(base, instances=(*others, dp8))


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def _select(pilot, name: str) -> None:
    table = pilot.app.screen.query_one(InstanceTable)
    table.move_cursor(row=table.order.index(name))
    await settle(pilot, lambda: pilot.app.selected == name)
    await settle(pilot)


async def test_a_dp_instance_shows_its_shape_and_its_ranks():
    client = make_client(dp_node())
    app = make_app(client)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        table = app.screen.query_one(InstanceTable)
        assert "parallel" in [c.key for c in table.columns_shown]
        assert table.get_cell("dp8", "parallel").plain == "TP1 x DP8"
        assert table.get_cell("gpu0", "parallel").plain == "TP1"
        await _select(pilot, "dp8")
        ranks = app.screen.query_one(SidePanel).query_one("#ranks")
        assert ranks.display
        lines = _plain(ranks).splitlines()
        assert lines[0] == "ranks TP1 x DP8"
        assert len(lines) == 9
        assert lines[4].split() == ["DP3", "GPU", "3", "pid", "41003", "●", "alive", "63.0G"]
        # another instance has no ranks list
        await _select(pilot, "gpu0")
        assert not app.screen.query_one(SidePanel).query_one("#ranks").display


async def test_a_dead_rank_is_marked_on_the_row_and_in_the_list():
    client = make_client(dp_node(dead_rank=3))
    app = make_app(client)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        await _select(pilot, "dp8")
        cell = app.screen.query_one(InstanceTable).get_cell("dp8", "parallel")
        assert cell.plain == "TP1 x DP8" and "red" in str(cell.style)
        lines = _plain(app.screen.query_one(SidePanel).query_one("#ranks")).splitlines()
        assert lines[4].split() == ["DP3", "GPU", "3", "pid", "41003", "✖", "dead", "-"]


async def test_without_dp_or_pp_the_table_has_no_shape_column():
    client = make_client(samples.gpu_node())
    app = make_app(client)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        table = app.screen.query_one(InstanceTable)
        assert "parallel" not in [c.key for c in table.columns_shown]
