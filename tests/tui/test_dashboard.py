"""The dashboard's refresh loop and table: snapshots in, diffed widgets out."""

from __future__ import annotations

import dataclasses

from vsup.snapshot import empty_instance
from vsup.tui import rows
from vsup.tui.messages import SnapshotArrived
from vsup.tui.screens.dashboard import Dashboard
from vsup.tui.screens.help import HelpScreen
from vsup.tui.widgets.detail import DetailTabs, SidePanel, SparkPanel
from vsup.tui.widgets.gpus import GpuPanel
from vsup.tui.widgets.header import Banner, NodeHeader
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.livelog import LiveLog

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle


def _replace(snap, name, **values):
    instances = tuple(i.with_wire(**values) if i.name == name else i for i in snap.instances)
    return dataclasses.replace(snap, instances=instances)


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def test_first_snapshot_fills_header_gpus_and_table_and_selects_first_row(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        table = app.screen.query_one(InstanceTable)
        assert table.order == [
            i.name for i in sorted(client.snapshot.instances, key=lambda i: i.name)
        ]
        assert app.selected == "gpu0"
        header = _plain(app.screen.query_one(NodeHeader))
        for part in ("gpu-node-07", "NVIDIA ×8", "daemon up 4h15m", "ready 7/9", "▲ 3 alerts"):
            assert part in header
        gpus = _plain(app.screen.query_one(GpuPanel)).splitlines()
        assert len(gpus) == 8
        assert "foreign 3.5G" in gpus[7] and "over plan" in gpus[6]
        # state is readable without colour
        assert table.get_cell("gpu7", "state").plain == "↻ backoff 37s"
        assert table.get_cell("gpu6b", "hbm").plain.startswith("▲")
        assert table.get_cell("gpu0", "backend").plain == "FLASH_ATTN"


async def test_cpu_node_says_so_in_one_line_and_marks_inferred_backend():
    client = make_client(samples.cpu_node())
    app = make_app(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
        assert _plain(app.screen.query_one(GpuPanel)) == "no GPUs (CPU node) · 2 instances on CPU"
        table = app.screen.query_one(InstanceTable)
        assert "hbm" not in [c.key for c in table.columns_shown]


async def test_unchanged_snapshot_causes_no_rendering(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        before = table.updates
        status_calls = len(client.calls_to("status"))
        app.tick()
        await settle(pilot, lambda: len(client.calls_to("status")) > status_calls)
        await settle(pilot)
        assert app.renders == 1 and table.updates == before


async def test_changed_metrics_touch_only_the_changed_cells_and_keep_the_cursor(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        await pilot.press("down", "down")
        assert app.selected == "gpu2"
        before = table.updates
        client.snapshot = _replace(
            client.snapshot, "gpu5", kv_cache_usage=0.97, requests_waiting=12.0
        )
        app.tick()
        await settle(pilot, lambda: app.renders == 2)
        assert table.updates - before == 2  # the KV cell and the RUN/WAIT cell
        assert table.get_cell("gpu5", "kv").plain == "97%"
        assert table.get_cell("gpu5", "run_wait").plain.endswith("/12")
        assert app.selected == "gpu2" and table.cursor_row == 2


async def test_rows_come_and_go_by_key_and_the_cursor_stays_on_its_instance(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        for _ in range(7):
            await pilot.press("down")
        assert app.selected == "gpu6b"
        snap = client.snapshot
        kept = tuple(i for i in snap.instances if i.name not in ("gpu1", "gpu2"))
        client.snapshot = dataclasses.replace(
            snap, instances=kept + (empty_instance("gpu8", state="starting", port=8010),)
        )
        app.tick()
        await settle(pilot, lambda: app.renders == 2)
        assert table.order == ["gpu0", "gpu3", "gpu4", "gpu5", "gpu6a", "gpu6b", "gpu7", "gpu8"]
        assert app.selected == "gpu6b"
        assert table.cursor_row == table.order.index("gpu6b")


async def test_sort_key_cycles_and_the_table_is_resorted_only_when_order_changes(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        sorts = []
        original = table.sort
        table.sort = lambda *a, **k: (sorts.append(a), original(*a, **k))[1]  # type: ignore[method-assign, func-returns-value]  # a spy
        await pilot.press("s")  # name -> state, problems first
        assert app.dashboard.sort_key == "state"
        assert table.order[:2] == ["gpu7", "gpu3"]  # backoff, starting
        assert len(sorts) == 1
        client.snapshot = _replace(client.snapshot, "gpu0", generation_tokens_per_s=1.0)
        app.tick()
        await settle(pilot, lambda: app.renders == 2)
        assert len(sorts) == 1  # a value changed, the order did not
        await pilot.press("s")  # state -> KV, fullest first
        assert table.order[0] == "gpu6b"
        await pilot.press("S")
        assert table.order[-1] == "gpu6b"
        assert "sort: KV cache use ▲" in str(app.screen.query_one("#table-box").border_title)


async def test_slash_filters_rows_and_escape_clears_the_filter(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        await pilot.press("slash")
        await pilot.press(*"gpu6")
        assert table.order == ["gpu6a", "gpu6b"]
        assert app.selected == "gpu6a"
        await pilot.press("enter")
        assert table.has_focus and table.order == ["gpu6a", "gpu6b"]
        await pilot.press("slash", "escape")
        assert len(table.order) == 9 and app.dashboard.filter_text == ""


async def test_daemon_gone_shows_a_banner_and_recovers_when_it_answers(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        banner = app.screen.query_one(Banner)
        client.unreachable = "no vsup daemon answers on /tmp/vsup-x/vsup.sock"
        app.tick()
        await settle(pilot, lambda: banner.has_class("-shown"))
        assert "daemon unreachable" in _plain(banner) and "vsup.sock" in _plain(banner)
        # the last data stays on screen while retrying
        assert len(app.screen.query_one(InstanceTable).order) == 9
        client.unreachable = None
        app.tick()
        await settle(pilot, lambda: not banner.has_class("-shown"))


async def test_snapshot_behind_a_modal_waits_until_the_dashboard_is_back(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        await pilot.press("question_mark")
        # the screen is pushed after the key's turn: on a loaded machine not by the next one
        await settle(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert isinstance(app.screen, HelpScreen)
        calls = len(client.calls)
        app.tick()  # behind a modal the timer schedules nothing
        assert len(client.calls) == calls
        newer = _replace(client.snapshot, "gpu0", kv_cache_usage=0.5)
        client.snapshot = newer
        app.post_message(SnapshotArrived(newer))  # a fetch that was in flight
        await settle(pilot)
        assert app.renders == 1
        table = app.screen_stack[0].query_one(InstanceTable)
        assert table.get_cell("gpu0", "kv").plain != "50%"
        await pilot.press("escape")
        await settle(pilot, lambda: app.renders == 2)
        assert table.get_cell("gpu0", "kv").plain == "50%"
        await settle(pilot)
        assert app.renders == 2  # the fetch on return found nothing new


def test_queued_snapshots_replace_each_other():
    a = SnapshotArrived(samples.cpu_node(0))
    b = SnapshotArrived(samples.cpu_node(1))
    assert b.can_replace(a)


async def test_narrow_terminal_drops_columns_and_wide_brings_them_back(client):
    app = make_app(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        narrow = [c.key for c in table.columns_shown]
        assert narrow[:2] == ["name", "state"] and "model" not in narrow
        assert sum(c.width + rows.PADDING for c in table.columns_shown) <= 80 - 4
        assert app.screen.has_class("-narrow")
        await pilot.resize_terminal(160, 45)
        await settle(pilot, lambda: "model" in [c.key for c in table.columns_shown])
        assert not app.screen.has_class("-narrow")
        assert table.order and app.selected == "gpu0"


async def test_selection_shows_history_config_with_secrets_masked_and_advice(client):
    client.histories["gpu6b"] = {
        "t": [1, 2, 3],
        "kv_cache_usage": [0.5, 0.8, 0.99],
        "generation_tokens_per_s": [900.0, 600.0, 410.0],
        "preemptions_per_min": [0.0, 12.0, 37.5],
    }
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        for _ in range(7):
            await pilot.press("down")
        await settle(pilot, lambda: "gpu6b" in app.history.seeded)
        assert list(app.history.values("gpu6b", "kv_cache_usage"))[:3] == [0.5, 0.8, 0.99]
        spark = app.screen.query_one(SparkPanel)
        assert spark.instance.name == "gpu6b"
        detail = app.screen.query_one(DetailTabs)
        await settle(pilot, lambda: "HF_TOKEN=****" in _plain(detail.query_one("#config")))
        config = _plain(detail.query_one("#config"))
        assert "hf_not_masked_by_daemon" not in config and "--max-model-len 8192" in config
        assert "num_gpu_blocks = 26952" in config
        advice = _plain(app.screen.query_one(SidePanel).query_one("#advice"))
        assert "KV cache 99%" in advice and "pid 99321" in advice
        assert "gpu-node" not in advice


async def test_log_tail_follows_by_offset_and_starts_over_on_a_new_run(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        log = app.screen.query_one("#log-tail", LiveLog)
        await settle(pilot, lambda: log.line_count >= 3)
        assert "Starting vLLM server" in log.lines[2]
        first = client.calls_to("logs")[0]
        assert first["name"] == "gpu0" and first["tail"] is not None
        client.logs_current["gpu0"] += "INFO a new line\n"
        app.tick()
        await settle(pilot, lambda: any("a new line" in line for line in log.lines))
        assert client.calls_to("logs")[-1]["offset"] > 0
        assert sum("Starting vLLM server" in line for line in log.lines) == 1


async def test_worker_failures_other_than_status_are_notified(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        client.configs.clear()

        async def broken(name):
            raise RuntimeError(f"config route failed for {name}")

        client.config = broken
        await pilot.press("down")
        await settle(
            pilot,
            lambda: any("config route failed for gpu1" in n.message for n in app._notifications),
        )
        assert isinstance(app.screen, Dashboard)


async def test_a_changed_cell_repaints_its_row_only(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        table = app.screen.query_one(InstanceTable)
        await settle(pilot)
        repaints = []
        original = table.refresh

        def spy(*regions, **kwargs):
            if not table._row_refresh_only:  # DataTable.update_cell's own call is held back
                repaints.append((regions, kwargs))
            return original(*regions, **kwargs)

        table.refresh = spy  # type: ignore[method-assign]  # a spy around the real method
        client.snapshot = _replace(client.snapshot, "gpu4", kv_cache_usage=0.11)
        app.tick()
        await settle(pilot, lambda: app.renders == 2)
        assert repaints, "the changed row was not repainted"
        assert all(regions for regions, _ in repaints), "a whole-table repaint for one cell"
        row_y = table.order.index("gpu4") + table.header_height - int(table.scroll_y)
        assert {r.y for regions, _ in repaints for r in regions} == {row_y}
        assert table.get_cell("gpu4", "kv").plain == "11%"


async def test_an_instance_without_a_log_says_so_once_until_it_runs():
    snap = _replace(samples.gpu_node(), "gpu0", state="stopped", pid=None, run=None)
    client = make_client(snap)
    del client.logs_current["gpu0"]
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        log = app.screen.query_one("#log-tail", LiveLog)
        await settle(pilot, lambda: log.line_count >= 1)
        assert "has no log yet" in log.lines[0]
        asked = len(client.calls_to("logs"))
        app.tick()
        await settle(pilot)
        assert len(client.calls_to("logs")) == asked  # not polled while it cannot have a log
        assert not app._notifications
        client.logs_current["gpu0"] = "INFO starting\n"
        client.snapshot = _replace(snap, "gpu0", state="starting", run=1)
        app.tick()
        await settle(pilot, lambda: any("INFO starting" in line for line in log.lines))


async def test_config_is_read_again_once_the_instance_is_ready(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        for _ in range(3):
            await pilot.press("down")
        await settle(pilot, lambda: client.calls_to("config")[-1:] == [{"name": "gpu3"}])
        asked = len(client.calls_to("config"))
        app.tick()
        await settle(pilot)
        assert len(client.calls_to("config")) == asked
        client.snapshot = _replace(client.snapshot, "gpu3", state="ready")
        app.tick()
        await settle(pilot, lambda: len(client.calls_to("config")) == asked + 1)


async def test_a_refresh_tick_after_the_last_screen_is_gone_does_nothing(client):
    # Seen on the H200 run: the refresh timer fired once more while the app shut down.
    app = make_app(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.selected is not None)
    made = len(client.calls)
    assert app.on_dashboard is False
    app.tick()  # must not raise ScreenStackError
    assert len(client.calls) == made, "a refresh was scheduled for a closed dashboard"


def test_every_column_has_a_cell_and_every_cell_a_column():
    """The row is table-driven (rows._CELLS): a column added without its cell, or a cell left
    behind by a removed column, shows here rather than as a KeyError on a live dashboard."""
    assert {c.key for c in rows.COLUMNS} == set(rows._CELLS)
