"""Sleep mode on the dashboard (issue 27): a sleeper's row says so where the state shows,
dimmed, with the memory it keeps in HBM; the side panel and Exit tab give its level, group,
durations, error and idle countdown; `z` puts the selected instance to sleep (asking first, as
a stop does: it then serves nothing), `Z` wakes it, and the palette offers `Swap A → B`.

The snapshots come from status JSON (what the daemon's /v1/status answers), parsed by the
dashboard like a live one."""

from __future__ import annotations

import copy

import pytest

from vsup.snapshot import StatusSnapshot
from vsup.tui.screens.confirm import ConfirmScreen
from vsup.tui.screens.dashboard import Dashboard
from vsup.tui.screens.help import HelpScreen
from vsup.tui.widgets.detail import DetailTabs, SidePanel, SparkPanel
from vsup.tui.widgets.header import header_text
from vsup.tui.widgets.instances import InstanceTable

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

GiB = 2**30
KEPT = int(1.7 * GiB)
ERROR = "/wake_up answered 500: CUDA out of memory. Tried to allocate 30.00 GiB"


def sleep_doc() -> dict:
    """gpu_node's status JSON with sleep mode: gpu0 awake and gpu1 asleep in swap group g0,
    gpu2 waking from level 2 and gpu5 asleep after a failed wake in group g1, gpu4 on its
    way to sleep, gpu3 starting (with sleep mode, awake); the others without sleep mode
    (`sleep: null`)."""
    doc = copy.deepcopy(samples.gpu_node().to_json())
    by_name = {i["name"]: i for i in doc["instances"]}
    idle = {
        "requests_running": 0.0,
        "requests_waiting": 0.0,
        "generation_tokens_per_s": 0.0,
        "kv_cache_usage": 0.0,
    }
    by_name["gpu0"]["sleep"] = {
        "state": "awake",
        "level": 1,
        "group": "g0",
        "since_s": 300.0,
        "last_sleep_s": 1.24,
        "last_wake_s": 0.91,
        "idle_sleep_in_s": 240.0,
    }
    for gpu in (1, 5):  # what NVML sees of a sleeper: the remainder it keeps
        g = doc["gpus"][gpu]
        g["processes"][0]["hbm_bytes"] = KEPT
        g["hbm_used_bytes"] = KEPT + 536_870_912
        g["util_pct"] = 0.0
    by_name["gpu1"].update(idle, hbm_bytes=KEPT + 2**20)
    by_name["gpu1"]["sleep"] = {
        "state": "asleep",
        "level": 1,
        "group": "g0",
        "since_s": 130.0,
        "last_sleep_s": 1.24,
        "last_wake_s": 0.91,
        "held_bytes": KEPT,
    }
    by_name["gpu2"].update(idle)
    by_name["gpu2"]["sleep"] = {"state": "waking", "level": 2, "group": "g1", "since_s": 3.0}
    by_name["gpu5"].update(idle, hbm_bytes=KEPT)
    by_name["gpu5"]["sleep"] = {
        "state": "asleep",
        "level": 1,
        "group": "g1",
        "since_s": 600.0,
        "error": ERROR,
    }
    by_name["gpu4"]["sleep"] = {"state": "falling_asleep", "level": 1, "since_s": 0.5}
    by_name["gpu3"]["sleep"] = {"state": "awake", "level": 1}
    return doc


def sleep_node() -> StatusSnapshot:
    return StatusSnapshot.from_json(sleep_doc())


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def _ready(pilot, app):
    await settle(pilot, lambda: app.renders >= 1 and app.selected is not None)


async def _select(pilot, app, name):
    table = app.screen.query_one(InstanceTable)
    table.move_cursor(row=table.order.index(name))
    await settle(pilot, lambda: app.selected == name)


def test_the_sleep_table_parses_from_status_json():
    snap = sleep_node()
    s = snap.instance("gpu1").sleep
    assert (s.state, s.level, s.group, s.held_bytes) == ("asleep", 1, "g0", KEPT)
    assert s.asleep and not snap.instance("gpu0").sleep.asleep
    assert snap.instance("gpu6a").sleep is None


async def test_a_sleeper_reads_as_such_in_its_row_dimmed_with_what_it_keeps():
    app = make_app(make_client(sleep_node()))
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        table = app.screen.query_one(InstanceTable)
        cells = {n: table.get_cell(n, "state") for n in ("gpu0", "gpu1", "gpu2", "gpu4", "gpu5")}
        assert cells["gpu1"].plain == "☾ asleep L1" and str(cells["gpu1"].style) == "dim"
        assert cells["gpu2"].plain == "☾ waking…"
        assert cells["gpu4"].plain == "☾ sleeping…"  # falling asleep, in the column's width
        assert cells["gpu5"].plain == "☾ asleep L1" and "red" in str(cells["gpu5"].style)
        assert cells["gpu0"].plain == "● ready", "awake with sleep mode: a plain ready row"
        assert table.get_cell("gpu3", "state").plain.startswith("◐"), "starting: its state"
        # sleepers are ready (live, healthy); the header says how many serve nothing
        assert "ready 7/9 (4 asleep)" in header_text(app.snapshot, False, False).plain
        assert "ready 7/9 ☾4" in header_text(app.snapshot, False, True).plain
        hbm = table.get_cell("gpu1", "hbm")
        assert hbm.plain == "☾1.7G" and str(hbm.style) == "dim"
        assert "/" not in hbm.plain, "a sleeper's planned share is not weighed against"
        assert table.get_cell("gpu0", "hbm").plain.endswith("/126G")

        # the filter finds sleepers by their sleep state (falling asleep too)
        app.dashboard.filter_text = "asleep"
        await settle(pilot, lambda: len(table.order) == 3)
        assert sorted(table.order) == ["gpu1", "gpu4", "gpu5"]
        app.dashboard.filter_text = "waking"
        await settle(pilot, lambda: table.order == ["gpu2"])


async def test_the_side_panel_and_exit_tab_give_the_sleep_details():
    app = make_app(make_client(sleep_node()))
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu1")
        side = app.screen.query_one(SidePanel)
        await settle(pilot, lambda: side.border_title == "gpu1 · ☾ asleep L1")
        line = _plain(side.query_one("#sleep"))
        assert line == (
            "sleep asleep for 2m10s · level 1 (weights in host RAM) · swap group g0 · "
            "last sleep 1.2s, wake 0.9s · keeps 1.7 GiB of GPU memory"
        )
        sparks = side.query_one(SparkPanel).render().plain
        assert sparks.startswith("☾ asleep L1\nasleep for 2m10s: serves nothing, routes none")
        exit_tab = _plain(app.screen.query_one(DetailTabs).query_one("#exit"))
        assert "sleep asleep for 2m10s · level 1" in exit_tab

        await _select(pilot, app, "gpu0")
        await settle(pilot, lambda: side.border_title == "gpu0 · ● ready")
        line = _plain(side.query_one("#sleep"))
        assert line == (
            "sleep awake for 5m00s · level 1 (weights in host RAM) · swap group g0 · "
            "last sleep 1.2s, wake 0.9s · idle sleep in 4m00s"
        )

        await _select(pilot, app, "gpu5")
        await settle(pilot, lambda: "failed" in _plain(side.query_one("#sleep")))
        assert _plain(side.query_one("#sleep")).endswith(f"last sleep/wake failed: {ERROR}")

        await _select(pilot, app, "gpu6a")
        await settle(pilot, lambda: side.border_title.startswith("gpu6a"))
        assert not side.query_one("#sleep").display, "no sleep mode: no sleep line"


async def test_z_asks_before_putting_the_selected_instance_to_sleep():
    client = make_client(sleep_node())
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu0")
        await pilot.press("z")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Put gpu0 to sleep?"
        assert "level 1: weights in host RAM" in app.screen.details
        await pilot.press("n")
        await settle(pilot, lambda: isinstance(app.screen, Dashboard))
        assert client.calls_to("action") == []
        await pilot.press("z")
        await pilot.press("y")
        await settle(pilot, lambda: client.calls_to("action"))
        assert client.calls_to("action") == [{"action": "sleep", "names": ["gpu0"], "all": False}]


async def test_shift_z_wakes_a_sleeper_without_asking():
    client = make_client(sleep_node())
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu1")
        await pilot.press("Z")
        await settle(pilot, lambda: client.calls_to("action"))
        assert isinstance(app.screen, Dashboard)
        assert client.calls_to("action") == [{"action": "wake", "names": ["gpu1"], "all": False}]


@pytest.mark.parametrize(
    "name,key,why",
    [
        ("gpu6a", "z", "gpu6a has no sleep mode (its layout needs sleep = { level = 1 })"),
        ("gpu1", "z", "gpu1 is asleep L1"),
        ("gpu0", "Z", "gpu0 is awake"),
        ("gpu2", "Z", "gpu2 is waking"),
    ],
)
async def test_sleep_and_wake_say_why_they_do_not_apply(name, key, why):
    client = make_client(sleep_node())
    app = make_app(client)
    notes: list[str] = []
    async with app.run_test(size=(160, 45)) as pilot:
        app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
        await _ready(pilot, app)
        await _select(pilot, app, name)
        await pilot.press(key)
        await settle(pilot)
        assert isinstance(app.screen, Dashboard)
    assert client.calls_to("action") == []
    assert any(why in n for n in notes), notes


async def test_readonly_disables_sleep_and_wake():
    client = make_client(sleep_node())
    app = make_app(client, readonly=True)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu1")
        await pilot.press("Z")
        await _select(pilot, app, "gpu0")
        await pilot.press("z")
        await settle(pilot)
        assert not any(c.title.startswith("Swap") for c in app.get_system_commands(app.screen))
    assert client.calls_to("action") == []


async def test_the_palette_swaps_the_selected_instance_for_a_sleeper():
    client = make_client(sleep_node())
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu0")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        swaps = [t for t in titles if t.startswith("Swap")]
        # the sleepers, its own swap group first; not the one waking
        assert swaps == ["Swap gpu0 → gpu1", "Swap gpu0 → gpu5"]
        assert "Sleep gpu0" in titles and "Wake gpu0" not in titles
        command = next(c for c in app.get_system_commands(app.screen) if c.title == swaps[0])
        command.callback()
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Swap gpu0 for gpu1?"
        await pilot.press("y")
        await settle(pilot, lambda: client.calls_to("action"))
        assert client.calls_to("action") == [
            {"action": "swap", "names": ["gpu0", "gpu1"], "all": False}
        ]

        await _select(pilot, app, "gpu1")  # asleep: nothing to swap out
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not any(t.startswith("Swap") for t in titles) and "Wake gpu1" in titles


async def test_help_lists_the_sleep_keys_and_the_sleep_look():
    app = make_app(make_client(sleep_node()))
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("question_mark")
        await settle(pilot, lambda: isinstance(app.screen, HelpScreen))
        from vsup.tui.screens.help import help_table

        assert isinstance(app.screen, HelpScreen)
        table = help_table(app.screen.keys, False)
        keys = [str(c) for c in table.columns[0]._cells]
        assert "z" in keys and "Z" in keys and "☾ asleep L1" in keys
