"""Every key of the dashboard, asserting on what the daemon was asked and what is shown."""

from __future__ import annotations

import dataclasses

import pytest
from textual.command import CommandList, CommandPalette

from vsup.tui import keymap
from vsup.tui.screens.confirm import ConfirmScreen
from vsup.tui.screens.dashboard import Dashboard
from vsup.tui.screens.help import HelpScreen
from vsup.tui.screens.logs import LogScreen
from vsup.tui.widgets.header import NodeHeader
from vsup.tui.widgets.livelog import LiveLog

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle


def _with_state(snap, name, **values):
    return dataclasses.replace(
        snap,
        instances=tuple(i.with_wire(**values) if i.name == name else i for i in snap.instances),
    )


async def _ready(pilot, app):
    await settle(pilot, lambda: app.renders >= 1 and app.selected is not None)


async def _select(pilot, app, name):
    from vsup.tui.widgets.instances import InstanceTable

    table = app.screen.query_one(InstanceTable)
    table.move_cursor(row=table.order.index(name))
    await settle(pilot, lambda: app.selected == name)


@pytest.mark.parametrize("key,verb", [("r", "restart"), ("x", "stop"), ("d", "drain")])
async def test_destructive_key_asks_first_and_acts_only_on_yes(client, key, verb):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu2")
        await pilot.press(key)
        assert isinstance(app.screen, ConfirmScreen)
        assert "gpu2" in app.screen.question
        await pilot.press("n")
        assert isinstance(app.screen, Dashboard)
        assert client.calls_to("action") == []
        await pilot.press(key)
        await pilot.press("y")
        await settle(pilot, lambda: client.calls_to("action"))
        assert client.calls_to("action") == [{"action": verb, "names": ["gpu2"], "all": False}]


async def test_confirm_defaults_to_no_on_enter(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("r", "enter")
        await settle(pilot)
        assert isinstance(app.screen, Dashboard) and client.calls_to("action") == []


async def test_start_acts_at_once_on_a_stopped_instance():
    client = make_client(_with_state(samples.gpu_node(), "gpu1", state="stopped", pid=None))
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu1")
        await pilot.press("u")
        await settle(pilot, lambda: client.calls_to("action"))
        assert client.calls_to("action") == [{"action": "start", "names": ["gpu1"], "all": False}]


async def test_keys_that_do_not_apply_to_the_selection_are_dimmed_and_explain_themselves(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        active = app.screen.active_bindings
        assert active["u"].enabled is False  # gpu0 is ready: start does not apply
        assert active["r"].enabled is True
        await pilot.press("u")
        await settle(pilot)
        assert client.calls_to("action") == []
        assert any("not applicable, gpu0 is ready" in n.message for n in app._notifications)


async def test_readonly_disables_every_key_that_changes_something(client):
    app = make_app(client, readonly=True)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        assert "READ-ONLY" in app.screen.query_one(NodeHeader).content.plain
        for key in ("r", "x", "d", "a", "e", "w", "ctrl+d"):
            await pilot.press(key)
            await settle(pilot)
            assert isinstance(app.screen, Dashboard), key
        assert client.calls_to("action") == [] and client.calls_to("layout") == []
        assert any("--readonly" in n.message for n in app._notifications)
        active = app.screen.active_bindings
        assert not active["r"].enabled and active["l"].enabled and active["q"].enabled
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not any(t.startswith(("Restart", "Stop", "Drain", "Add", "Save")) for t in titles)
        assert "Logs gpu0" in titles


async def test_l_opens_the_full_screen_log_that_follows_and_escape_returns(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("l")
        screen = app.screen
        assert isinstance(screen, LogScreen) and not screen.previous and screen.follow
        log = screen.query_one("#log-full", LiveLog)
        await settle(pilot, lambda: log.line_count >= 3)
        client.logs_current["gpu0"] += "INFO one more line\n"
        screen._read()
        await settle(pilot, lambda: any("one more line" in ln for ln in log.lines))
        await pilot.press("f")
        assert not screen.follow
        client.logs_current["gpu0"] += 'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
        screen._read()
        await settle(pilot, lambda: screen.reads >= 3)
        assert not any("GET /health" in ln for ln in log.lines)  # vsup's own probes hidden
        await pilot.press("h")
        assert any("GET /health" in ln for ln in log.lines)
        await pilot.press("escape")
        assert isinstance(app.screen, Dashboard)


async def test_p_opens_the_previous_runs_log(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await _select(pilot, app, "gpu7")  # it has exited before
        await pilot.press("p")
        screen = app.screen
        assert isinstance(screen, LogScreen) and screen.previous
        await settle(pilot, lambda: screen.reads == 1)
        assert client.calls_to("logs")[-1]["previous"] is True
        assert any("OutOfMemoryError" in ln for ln in screen.query_one("#log-full", LiveLog).lines)


async def test_p_does_not_apply_to_an_instance_that_never_exited(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("p")
        assert isinstance(app.screen, Dashboard)


async def test_question_mark_shows_help_with_remapped_keys(client):
    app = make_app(client, keymap={"restart": "R", "help": "f1"})
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("question_mark")
        assert isinstance(app.screen, Dashboard)  # `?` was remapped away
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        assert app.screen.keys["restart"] == "R" and app.screen.keys["help"] == "f1"
        await pilot.press("escape")
        await pilot.press("r")
        assert isinstance(app.screen, Dashboard)
        await pilot.press("R")
        assert isinstance(app.screen, ConfirmScreen)


async def test_palette_offers_what_applies_to_the_selection_and_runs_it(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Restart gpu0" in titles and "Drain gpu0" in titles
        assert not any(t.startswith("Start") for t in titles)  # gpu0 is running
        assert "Previous log gpu0" not in titles
        await _select(pilot, app, "gpu7")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Prev log gpu7" in titles and "Drain gpu7" not in titles
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"restart gpu7")
        commands = app.screen.query_one(CommandList)
        await settle(pilot, lambda: commands.option_count > 0, delay=0.05)
        assert "Restart gpu7" in str(commands.get_option_at_index(0).prompt)
        await pilot.press("enter")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        assert "gpu7" in app.screen.question


async def test_q_detaches_without_stopping_anything(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("q")
        await settle(pilot, lambda: app.return_code is not None)
    assert client.calls_to("action") == []
    assert not any(c.method in ("apply", "save") for c in client.calls)


def test_keymap_comes_from_the_config_file_then_the_environment(tmp_path):
    conf = tmp_path / "tui.toml"
    conf.write_text('[keymap]\nrestart = "R"\nstop = "ctrl+k"\n')
    env = {"VSUP_TUI_CONFIG": str(conf), "VSUP_KEYMAP": "stop=K; help=f1"}
    assert keymap.load_keymap(environ=env) == {"restart": "R", "stop": "K", "help": "f1"}
    assert keymap.load_keymap(discover=False, environ=env) == {}


def test_keymap_with_an_unknown_id_names_the_file_and_the_known_ids(tmp_path):
    conf = tmp_path / "tui.toml"
    conf.write_text('[keymap]\nreboot = "R"\n')
    with pytest.raises(
        ValueError, match=r"tui.toml: unknown key binding id\(s\) reboot; known: .*restart"
    ):
        keymap.load_keymap(environ={"VSUP_TUI_CONFIG": str(conf)})
    with pytest.raises(ValueError, match="VSUP_KEYMAP: 'restart' is not ID=KEY"):
        keymap.load_keymap(environ={"VSUP_KEYMAP": "restart"})


async def test_letters_typed_into_the_filter_are_text_not_commands(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("slash", "q", "r", "x", "s")
        await settle(pilot)
        assert app.dashboard.filter_text == "qrxs" and isinstance(app.screen, Dashboard)
        assert app.return_code is None and client.calls_to("action") == []
