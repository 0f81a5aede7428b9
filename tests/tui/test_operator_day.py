"""The dashboard's part of issue 25 (an operator's first day): the filter, the header's worst
alert, the model's served name, keys for the detail tabs, the previous-run message, long log
lines, asking before an added instance starts, and saving without losing comments."""

from __future__ import annotations

import dataclasses
import tomllib

from rich.console import Console
from textual.widgets import Footer, Input, TabbedContent

from vsup.layout.spec import InstanceSpec
from vsup.routerview import router_line
from vsup.snapshot import Advice, RouterStatus, empty_instance
from vsup.states import State
from vsup.tui import fmt
from vsup.tui.screens.confirm import ConfirmScreen
from vsup.tui.screens.dashboard import Dashboard, FilterInput
from vsup.tui.screens.form import InstanceFormScreen
from vsup.tui.screens.help import HelpScreen, help_table
from vsup.tui.screens.save import SaveScreen
from vsup.tui.widgets.header import NodeHeader, header_text
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.livelog import CUT_LEFT, CUT_RIGHT, LiveLog

from tests.support import samples
from tests.tui.conftest import config_doc, make_app, make_client, settle


def _with(snap, name, **values):
    return dataclasses.replace(
        snap,
        instances=tuple(i.with_wire(**values) if i.name == name else i for i in snap.instances),
    )


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def _ready(pilot, app):
    await settle(pilot, lambda: app.renders >= 1 and app.selected is not None)


async def test_the_filter_is_a_visible_line_above_the_footer_and_slash_toggles_it(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("slash", *"gpu6")
        box = app.screen.query_one(FilterInput)
        footer = app.screen.query_one(Footer)
        await settle(pilot)
        assert box.has_focus and box.display
        # its own line, right above the footer (not under it)
        assert box.region.height == 1 and box.region.bottom == footer.region.y
        assert app.screen.get_widget_at(box.region.x + 2, box.region.y)[0] is box
        assert app.screen.query_one(InstanceTable).order == ["gpu6a", "gpu6b"]
        # `/` again: not typed; the filter stays and the table has the keys again
        await pilot.press("slash")
        table = app.screen.query_one(InstanceTable)
        assert box.value == "gpu6" and app.dashboard.filter_text == "gpu6"
        assert table.has_focus and box.display
        # `/` from the table: back into the filter, to change it
        await pilot.press("slash", "a")
        assert box.has_focus and box.value == "gpu6a"
        await pilot.press("escape")
        assert not box.display and app.dashboard.filter_text == "" and table.has_focus
        assert len(table.order) == 9


async def test_previous_log_of_a_first_run_says_there_is_no_previous_run():
    snap = samples.cpu_node()
    first = next(
        i for i in snap.instances if (i.lifecycle.run or 0) <= 1 and i.lifecycle.last_exit is None
    )
    client = make_client(snap)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        table = app.screen.query_one(InstanceTable)
        table.move_cursor(row=table.order.index(first.name))
        await settle(pilot, lambda: app.selected == first.name)
        await pilot.press("p")
        await settle(pilot, lambda: bool(app._notifications))
        messages = [n.message for n in app._notifications]
        assert any(f"{first.name} has no previous run" in m for m in messages), messages
        assert not any("is ready" in m for m in messages)
        assert isinstance(app.screen, Dashboard)


async def test_the_detail_tabs_are_reachable_from_the_keyboard(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        tabs = app.screen.query_one(TabbedContent)
        assert tabs.active == "tab-log"
        await pilot.press("t")
        assert tabs.active == "tab-config"
        await pilot.press("t")
        assert tabs.active == "tab-exit"
        await pilot.press("t")
        assert tabs.active == "tab-log"
        await pilot.press("3")
        assert tabs.active == "tab-exit"
        await pilot.press("2")
        assert tabs.active == "tab-config"
        await pilot.press("1")
        assert tabs.active == "tab-log"
        # in the footer of a wide terminal, and in the help
        assert app.screen.active_bindings["t"].binding.show
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert (app.screen.keys["next_tab"], app.screen.keys["tab_exit"]) == ("t", "3")
        lines = Console(width=120, record=True)
        lines.print(help_table(app.screen.keys, False))
        assert "Next tab of the detail pane: Log, Config, Exit" in lines.export_text()


async def test_the_header_names_the_worst_alert_beside_the_count():
    snap = samples.gpu_node()
    warning_first = (
        Advice(kind="foreign_process", severity="warning", message="GPU 7: held", gpu=7),
        Advice(kind="crash_loop", severity="critical", message="gpu7: exits", instance="gpu7"),
    )
    client = make_client(dataclasses.replace(snap, advice=warning_first))
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        header = app.screen.query_one(NodeHeader)
        assert "▲ 2 alerts · worst: gpu7 crash loop" in _plain(header)
        client.snapshot = dataclasses.replace(snap, advice=warning_first[:1])
        app.tick()
        await settle(pilot, lambda: "▲ 1 alert · " in _plain(header))
        assert _plain(header).endswith("▲ 1 alert · GPU 7: foreign process")
    # a narrow terminal: what fits, and the marks after it stay on the line
    line = header_text(dataclasses.replace(snap, advice=warning_first), True, True, 80).plain
    assert len(line) <= 80 and line.rstrip().endswith("READ-ONLY")


def test_a_narrow_header_with_a_router_keeps_the_alerts_on_the_line():
    # 80 columns: the ready router's endpoint (shown in the table's bottom line) used to push
    # the count past the edge (`▲ 2` and no worst alert), as seen in tmux at 80x24
    snap = samples.cpu_node()
    first = snap.instances[0].name
    advice = (
        Advice(kind="kv_exhausted", severity="warning", message="KV", instance=first),
        Advice(kind="crash_loop", severity="critical", message="exits", instance=first),
    )
    router = RouterStatus(state=State.READY, port=18210, endpoint="http://127.0.0.1:18210", url="x")
    snap = dataclasses.replace(snap, advice=advice, router=router)
    line = header_text(snap, False, True, 80).plain
    assert len(line) <= 80, line
    assert f"▲ 2 alerts · {first} crash" in line, line
    assert "18210" in (router_line(router) or "")  # the table's bottom line still names it
    # a router that is not ready stays in the header, in red
    down = dataclasses.replace(snap, router=dataclasses.replace(router, state=State.FAILED))
    assert "http://127.0.0.1:18210 failed" in header_text(down, False, True, 80).plain


async def test_the_model_column_shows_the_served_name_and_the_config_tab_the_whole_path():
    snap = samples.cpu_node()
    a, b = (i.name for i in snap.instances)
    path = snap.instance(a).model
    assert path is not None and path.startswith("/") and path.count("/") > 2
    snap = _with(snap, b, served_model_name="tiny")
    configs = {}
    for inst in snap.instances:
        doc = config_doc(inst.name, inst.port)
        doc["spec"]["model"] = inst.model  # as the daemon's config route has it
        configs[inst.name] = doc
    client = make_client(snap, configs=configs)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        table = app.screen.query_one(InstanceTable)
        assert table.get_cell(a, "model").plain == path.rsplit("/", 1)[-1]  # tiny-llama
        assert table.get_cell(b, "model").plain == "tiny"
        await pilot.press("2")
        config = app.screen.query_one("#config")
        await settle(pilot, lambda: "model    " in _plain(config))
        assert f"model    {path}" in _plain(config)
    hub = empty_instance("h", model="Qwen/Qwen2.5-7B-Instruct")
    assert fmt.model_label(hub) == "Qwen/Qwen2.5-7B-Instruct"
    # too long for the column: the model's own name, cut at its end
    assert fmt.model_name("Qwen/Qwen2.5-7B-Instruct", 24) == "Qwen/Qwen2.5-7B-Instruct"
    assert fmt.model_name("Qwen/Qwen2.5-7B-Instruct", 18) == "Qwen2.5-7B-Instru…"


def test_the_served_model_name_comes_from_the_args_or_the_pulled_hub_id():
    def spec(model="/models/llama", **kw):
        return InstanceSpec("a", model, ("vllm", "serve"), "127.0.0.1", 8000, (), None, **kw)

    assert spec().served_model_name is None
    assert spec(args={"served-model-name": "llama"}).served_model_name == "llama"
    assert spec(args={"served_model_name": ["x", "y"]}).served_model_name == "x"
    pulled = spec(model="org/m", model_path="/cache/snapshots/abc")
    assert pulled.served_model_name == "org/m"


async def test_a_log_line_wider_than_the_pane_ends_in_a_marker():
    snap = samples.cpu_node()
    first = sorted(i.name for i in snap.instances)[0]
    long_line = "INFO start " + " ".join(f"arg{n}=value{n}" for n in range(40)) + " END"
    logs = {i.name: f"short line\n{long_line}\nlast\n" for i in snap.instances}
    client = make_client(snap, logs_current=logs)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        assert app.selected == first
        log = app.screen.query_one("#log-tail", LiveLog)

        def shown(index: int) -> str:
            return log.render_line(index - round(log.scroll_offset.y)).text

        # the lines in, laid out and drawn (under load the widget has them before a refresh
        # draws them at the pane's final width: a run of the suite on 2 busy cores failed here)
        await settle(
            pilot,
            lambda: (
                log.line_count >= 3
                and log.size.width > 0
                and shown(1).rstrip().endswith(CUT_RIGHT)
                and len(shown(1).rstrip()) == log.scrollable_content_region.width
            ),
        )
        width = log.scrollable_content_region.width  # what shows, past any scrollbar
        assert len(long_line) > width
        assert CUT_RIGHT in app.export_screenshot()  # on the screen, not only in the widget

        assert shown(1).rstrip().endswith(CUT_RIGHT) and len(shown(1).rstrip()) == width
        assert shown(1).rstrip()[:-1] == long_line[: width - 1]
        assert CUT_RIGHT not in shown(0) and shown(0).rstrip() == "short line"
        log.scroll_to(x=20, animate=False, immediate=True)  # not deferred past a refresh

        def scrolled() -> bool:
            # a log poll that lands meanwhile may lay the pane out again and put it back at
            # x 0 (a loaded suite's run, once): scrolled again then, as an operator would
            if log.scroll_offset.x != 20:
                log.scroll_to(x=20, animate=False, immediate=True)
                return False
            return shown(1).startswith(CUT_LEFT)

        await settle(pilot, scrolled)
        assert (
            shown(1).startswith(CUT_LEFT)
            and shown(1).rstrip()[1:-1] == long_line[21 : 20 + width - 1]
        )


async def test_an_added_instance_starts_only_after_a_yes(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("a")
        await settle(pilot, lambda: isinstance(app.screen, InstanceFormScreen))
        form = app.screen
        form.query_one("#field-name", Input).value = "gpu7b"
        form.query_one("#field-gpus", Input).value = "7"
        form.query_one("#field-gpu_memory_utilization", Input).value = "0.05"
        form.query_one("#field-name", Input).focus()
        await pilot.press("enter")  # the prefilled form submitted at once
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Start gpu7b?"
        assert "start: gpu7b" in str(app.screen.details)
        await pilot.press("enter")  # the focused answer is No
        await settle(pilot, lambda: isinstance(app.screen, Dashboard))
        assert [c["dry_run"] for c in client.calls_to("apply")] == [True]
        assert "gpu7b" not in {i.name for i in client.snapshot.instances}


async def test_saving_over_the_layout_file_keeps_its_comments_and_says_what_it_could_not(
    client, tmp_path
):
    noted = tmp_path / "noted.toml"
    noted.write_text("# the operator's note: ask before moving gpu6b\n" + client.layout_toml)
    garbled = tmp_path / "garbled.toml"
    garbled.write_text("# half an edit\n[instance\n")
    app = make_app(client)
    # every notification as it is posted: one times out, and under a loaded suite the first
    # was gone by the time the second save was said, and once before the test looked at all
    posted: list[tuple[str, str]] = []
    notify = app.notify

    def recording(message, *args, **kwargs):
        posted.append((str(message), str(kwargs.get("severity", "information"))))
        return notify(message, *args, **kwargs)

    app.notify = recording  # type: ignore[method-assign]
    saved: list[tuple[str, str]] = []
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        for target in (noted, garbled):
            await pilot.press("w")
            await settle(pilot, lambda: isinstance(app.screen, SaveScreen))
            app.screen.query_one("#path", Input).value = str(target)
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, Dashboard))
            said = f"saved the running layout to {target}"
            await settle(pilot, lambda s=said: any(s in m for m, _ in posted))
            saved += [n for n in posted if said in n[0]][-1:]
    assert saved[0][0] == f"saved the running layout to {noted} (its comments and formatting kept)"
    assert noted.read_text().startswith("# the operator's note: ask before moving gpu6b\n")
    assert saved[1][1] == "warning" and saved[1][0] == (
        f"saved the running layout to {garbled}, but the comments and formatting of {garbled} "
        "could not be kept (it was rewritten in vsup's own format)"
    )
    assert tomllib.loads(garbled.read_text()) == tomllib.loads(client.layout_toml)
