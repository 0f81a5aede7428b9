"""The typed client (vsup.answers) against a real daemon's control API, in process: every route's
answer read as its type, and that type written back gives the JSON the daemon sent (nothing of
the wire is lost). The decoders tolerate keys a newer daemon adds and name a missing one."""

from __future__ import annotations

import asyncio
import os

import pytest

from vsup import answers
from vsup.answers import (
    ActionAnswer,
    ApplyAnswer,
    BadAnswer,
    BenchProgressAnswer,
    History,
    InstanceConfig,
    LayoutAnswer,
    LogChunk,
    Ping,
    Problem,
    SaveAnswer,
    ShutdownAnswer,
)
from vsup.control.client import AsyncClient, Client, JsonClient
from vsup.control.errors import ControlError
from vsup.snapshot import BenchStatus, StatusSnapshot

from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(60)


async def test_every_route_reads_as_its_type_and_writes_back_as_the_wire(
    daemons, vsup_home, tmp_path
):
    daemon, wire = await daemons.start()
    async with AsyncClient(vsup_home) as client:
        ping = await client.ping()
        assert isinstance(ping, Ping) and ping.pid == os.getpid()
        assert ping.to_json() == await wire.ping()
        empty = await client.status()
        assert isinstance(empty, StatusSnapshot) and empty.instances == ()
        assert (await client.status_json())["schema"] == 1
        assert await client.layout() == LayoutAnswer(path=None, toml=None, name=None)

        clash = emulator_layout({"a": free_port(), "b": free_port()}).replace(
            'model = "test/fake"', ""
        )
        refused = await client.apply(clash, "/tmp/x.toml")
        assert isinstance(refused, ApplyAnswer) and refused.plan is None and not refused.applied
        assert all(isinstance(e, Problem) and e.severity == "error" for e in refused.errors)
        assert "model" in " ".join(str(e) for e in refused.errors)

        text = emulator_layout({"a": free_port(), "b": free_port()})
        dry = await client.apply(text, "/tmp/fakes.toml", dry_run=True)
        assert dry.plan is not None and dry.plan.start == ("a", "b") and not dry.applied
        wire_dry = await wire.apply(text, "/tmp/fakes.toml", dry_run=True)
        assert answers.to_json(dry) == wire_dry  # every key of the plan is read
        applied = await client.apply(text, "/tmp/fakes.toml")
        assert applied.applied and applied.plan is not None and applied.plan.start == ("a", "b")
        for name in ("a", "b"):
            assert await daemon.engine.wait(name, ("ready",), timeout=20) == "ready"

        layout = await client.layout()
        assert layout.name == "fakes" and layout.toml == text
        assert answers.to_json(layout) == await wire.layout()
        assert [i.name for i in (await client.status()).instances] == ["a", "b"]

        config = await client.config("a")
        assert isinstance(config, InstanceConfig) and "--port" in config.argv
        wire_config = await wire.config("a")  # cache_config comes once vLLM reports it
        assert set(answers.to_json(config)) == set(wire_config)
        assert answers.to_json(config)["argv"] == wire_config["argv"]
        assert config.env == wire_config["env"] and config.spec == wire_config["spec"]
        history = await client.history("a")
        assert isinstance(history, History) and len(history.t) == len(history.kv_cache_usage)
        assert set(answers.to_json(history)) == set(await wire.history("a"))
        log = await client.logs("a", offset=0)
        assert isinstance(log, LogChunk) and log.run == 1 and "emulator server" in log.text
        assert log.start == 0 and log.size is not None and log.offset <= log.size

        done = await client.action("restart", ["a"])
        assert done == ActionAnswer(done=("a",), errors=())
        # an instance without sleep mode refuses to sleep: the answer's error names it
        refused_sleep = await client.action("sleep", ["b"])
        assert refused_sleep.done == () and [e.name for e in refused_sleep.errors] == ["b"]
        assert str(refused_sleep.errors[0]).startswith("b: ")

        saved = await client.save(tmp_path / "saved.toml")
        assert isinstance(saved, SaveAnswer) and saved.written == str(tmp_path / "saved.toml")
        assert (tmp_path / "saved.toml").exists() and saved.outdated == ()

        report = {"pid": os.getpid(), "phase": "running", "layout": "fakes", "index": 1}
        progress = await asyncio.to_thread(_bench_progress, vsup_home, report)
        assert isinstance(progress, BenchProgressAnswer)
        assert isinstance(progress.bench, BenchStatus) and progress.bench.phase == "running"

        down = await client.shutdown(stop_instances=True)
        assert isinstance(down, ShutdownAnswer) and set(down.stopping) == {"a", "b"}


def _bench_progress(home, report) -> BenchProgressAnswer:
    with Client(home) as client:
        return client.bench_progress(report)


def test_keys_a_newer_daemon_adds_are_ignored():
    doc = {
        "done": ["a"],
        "errors": [],
        "since": "a newer daemon",
        "result": {"instance": "a", "took_s": 1.5, "level": 1, "gpu": {"freed": 3}},
    }
    answer = ActionAnswer.from_json(doc)
    assert answer.done == ("a",) and answer.result is not None and answer.result.took_s == 1.5
    plan = {"start": ["a"], "waves": [["a"]], "changes": {"a": [{"key": "k", "old": 1, "x": 0}]}}
    apply = ApplyAnswer.from_json({"plan": plan, "errors": [], "cost": 3})
    assert apply.plan is not None and apply.plan.changes["a"][0].old == 1


@pytest.mark.parametrize(
    "cls, doc, words",
    [
        (ActionAnswer, {"errors": []}, ["POST /v1/actions", "lacks the key 'done'"]),
        (ActionAnswer, {"done": [], "errors": [{"name": "a"}]}, ["'errors[0].error'"]),
        (ActionAnswer, {"done": "a", "errors": []}, ["'done' as str, not a list"]),
        (ApplyAnswer, {"plan": None}, ["POST /v1/apply", "lacks the key 'errors'"]),
        (ApplyAnswer, {"plan": {"start": [1]}, "errors": []}, ["'plan.start[0]' as int"]),
        (Ping, {"pid": 1, "version": "1"}, ["GET /v1/ping", "'home'"]),
        (LogChunk, ["not", "an", "object"], ["the answer as list, not an object"]),
        (ShutdownAnswer, {}, ["'stopping'"]),
    ],
)
def test_a_missing_or_mistyped_key_is_named_with_its_route(cls, doc, words):
    with pytest.raises(BadAnswer) as err:
        cls.from_json(doc)
    for w in words:
        assert w in str(err.value)


def test_the_client_reports_an_answer_of_another_shape_as_a_control_error(monkeypatch, tmp_path):
    monkeypatch.setattr(JsonClient, "ping", lambda self: {"pid": 1, "version": "9"})
    with Client(tmp_path) as client, pytest.raises(ControlError) as err:
        client.ping()
    assert err.value.status == 502 and "'home'" in err.value.message
    monkeypatch.setattr(JsonClient, "status", lambda self: {"schema": 2})
    with Client(tmp_path) as client, pytest.raises(ControlError) as err:
        client.status()
    assert "GET /v1/status" in err.value.message and "schema" in err.value.message
