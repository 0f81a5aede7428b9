"""Layout editing from the dashboard: add, edit, remove an instance, save the layout.

Every path ends in what the daemon was asked (apply dry run, apply, save) or in the form
refusing with the message an operator needs."""

from __future__ import annotations

import tomllib

import pytest
from textual.widgets import Input, Static

from vsup.tui.screens.confirm import ConfirmScreen
from vsup.tui.screens.dashboard import Dashboard
from vsup.tui.screens.form import InstanceFormScreen
from vsup.tui.screens.save import SaveScreen

from tests.tui.conftest import make_app, make_client, settle

# What a daemon that checks more than the layout rules can answer (the node it runs on).
REFUSAL = "instance 'gpu9': the daemon cannot start CPU instances beside GPU ones on this node"


async def _ready(pilot, app):
    await settle(pilot, lambda: app.renders >= 1 and app.selected is not None)


async def _open_form(pilot, app, key):
    await pilot.press(key)
    await settle(pilot, lambda: isinstance(app.screen, InstanceFormScreen))
    return app.screen


def _fill(form, **values):
    for key, value in values.items():
        form.query_one(f"#field-{key}", Input).value = value


def _instances(toml_text):
    return {t["name"]: t for t in tomllib.loads(toml_text)["instance"]}


async def test_add_validates_with_a_dry_run_then_applies_the_new_layout(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "a")
        assert form.values()["port"] == "8009"  # next to the highest port in use
        _fill(
            form,
            name="gpu7b",
            gpus="7",
            gpu_memory_utilization="0.05",
            args="max-model-len = 4096, enforce-eager = true",
        )
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Start gpu7b?"
        await pilot.press("y")
        await settle(pilot, lambda: len(client.calls_to("apply")) == 2)
        dry, real = client.calls_to("apply")
        assert dry["dry_run"] is True and real["dry_run"] is False
        assert dry["toml"] == real["toml"] and real["path"] == "/srv/layouts/sample.toml"
        added = _instances(real["toml"])["gpu7b"]
        assert added == {
            "name": "gpu7b",
            "gpus": [7],
            "port": 8009,
            "gpu_memory_utilization": 0.05,
            "args": {"max-model-len": 4096, "enforce-eager": True},
        }
        assert isinstance(app.screen, Dashboard)
        assert any("start: gpu7b" in n.message for n in app._notifications)


async def test_add_with_a_port_that_is_not_a_number_is_refused_in_the_form(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "a")
        _fill(form, port="80x0")
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: "80x0" in form.status_text)
        assert "port: '80x0' is not a port number; write e.g. 8000" in form.status_text
        assert app.screen is form and client.calls_to("apply") == []


async def test_add_with_args_that_are_not_toml_is_refused_in_the_form(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "a")
        _fill(form, args="max-model-len 4096")
        await pilot.press("enter")  # Enter in a field submits too
        await settle(pilot, lambda: "args:" in form.status_text)
        assert "not a TOML inline table body" in form.status_text
        assert client.calls_to("apply") == []


@pytest.mark.parametrize(
    "fields,message",
    [
        (
            {"name": "gpu7b", "gpus": "7", "gpu_memory_utilization": "0.3"},
            "GPU 7 is over-committed: gpu_memory_utilization adds up to 1.20",
        ),
        (
            {"name": "gpu9", "port": "8001", "gpus": "7", "gpu_memory_utilization": "0.05"},
            "port 8001 is also used by instance 'gpu1'",
        ),
        ({"name": "gpu9", "gpus": "8", "gpu_memory_utilization": "0.5"}, "GPU 8"),
        ({"name": "gpu1"}, "another instance already has this name"),
    ],
)
async def test_add_that_breaks_a_layout_rule_is_refused_with_the_rules_message(
    client, fields, message
):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "a")
        _fill(form, **fields)
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: "fix this first" in form.status_text)
        assert message in form.status_text
        assert "/srv/layouts/sample.toml" in form.status_text  # names the file to fix
        assert app.screen is form and client.calls_to("apply") == []


async def test_add_refused_by_the_daemons_dry_run_shows_its_message_and_applies_nothing():
    client = make_client(validate=lambda toml, path: ([REFUSAL], []))
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "a")
        _fill(form, name="gpu9", gpus="")
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: "cannot start" in form.status_text)
        assert REFUSAL in form.status_text
        assert [c["dry_run"] for c in client.calls_to("apply")] == [True]
        # the operator can fix and submit again without reopening the form
        client.validate = None
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await settle(pilot, lambda: len(client.calls_to("apply")) == 3)
        assert client.calls_to("apply")[-1]["dry_run"] is False


async def test_edit_prefills_the_instance_keeps_unshown_keys_and_confirms_a_restart():
    client = make_client()
    doc = tomllib.loads(client.layout_toml)
    import tomli_w

    for table in doc["instance"]:
        if table["name"] == "gpu2":
            table["restart"] = {"policy": "always"}
    client.layout_toml = tomli_w.dumps(doc)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("down", "down")
        form = await _open_form(pilot, app, "e")
        assert form.values()["name"] == "gpu2" and form.values()["port"] == "8002"
        assert form.values()["gpu_memory_utilization"] == "0.9"
        _fill(form, gpu_memory_utilization="0.85")
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        assert "restart: gpu2" in str(app.screen.details)
        await pilot.press("y")
        await settle(pilot, lambda: len(client.calls_to("apply")) == 2)
        edited = _instances(client.calls_to("apply")[-1]["toml"])["gpu2"]
        assert edited["gpu_memory_utilization"] == 0.85
        assert edited["restart"] == {"policy": "always"} and edited["gpus"] == [2]


async def test_edit_cancelled_with_escape_changes_nothing(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "e")
        _fill(form, port="9999")
        await pilot.press("escape")
        await settle(pilot, lambda: isinstance(app.screen, Dashboard))
        assert client.calls_to("apply") == []


async def test_edit_declined_at_the_restart_question_applies_nothing(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app, "e")
        _fill(form, port="9000")
        await pilot.press("ctrl+s")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await settle(pilot)
        assert [c["dry_run"] for c in client.calls_to("apply")] == [True]


async def test_remove_asks_then_applies_the_layout_without_the_instance(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("down")
        await pilot.press("ctrl+d")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        assert "Remove gpu1" in app.screen.question and "stop: gpu1" in str(app.screen.details)
        await pilot.press("y")
        await settle(pilot, lambda: len(client.calls_to("apply")) == 2)
        assert "gpu1" not in _instances(client.calls_to("apply")[-1]["toml"])
        assert len(_instances(client.calls_to("apply")[-1]["toml"])) == 8


async def test_remove_declined_applies_nothing(client):
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("ctrl+d")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("escape")
        await settle(pilot)
        assert [c["dry_run"] for c in client.calls_to("apply")] == [True]


async def test_save_writes_the_running_layout_through_the_daemon(client, tmp_path):
    app = make_app(client)
    target = tmp_path / "saved.toml"
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("w")
        await settle(pilot, lambda: isinstance(app.screen, SaveScreen))
        path = app.screen.query_one("#path", Input)
        assert path.value == "/srv/layouts/sample.toml"
        path.value = str(target)
        await pilot.press("enter")
        await settle(pilot, lambda: isinstance(app.screen, Dashboard))
    assert client.calls_to("save") == [{"path": str(target)}]
    assert tomllib.loads(target.read_text()) == tomllib.loads(client.layout_toml)


async def test_save_refused_by_the_daemon_says_why_and_writes_nothing(tmp_path):
    client = make_client()
    doc = tomllib.loads(client.layout_toml)
    doc["instance"][2]["port"] = doc["instance"][1]["port"]  # a running layout gone bad
    import tomli_w

    client.layout_toml = tomli_w.dumps(doc)
    app = make_app(client)
    target = tmp_path / "saved.toml"
    async with app.run_test(size=(160, 45)) as pilot:
        await _ready(pilot, app)
        await pilot.press("w")
        await settle(pilot, lambda: isinstance(app.screen, SaveScreen))
        app.screen.query_one("#path", Input).value = str(target)
        await pilot.press("enter")
        status = app.screen.query_one("#status", Static)
        await settle(pilot, lambda: "not saved" in str(status.content))
        assert "port 8001 is also used by instance 'gpu1'" in str(status.content)
        assert isinstance(app.screen, SaveScreen)
    assert not target.exists()
