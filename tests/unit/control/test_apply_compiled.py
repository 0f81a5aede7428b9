"""The daemon's apply over the compiled layout: the TOML is parsed once per request, the dry
run says what changes per instance, and an apply that lands while the runner is inside its
spawn still restarts the instance onto the layout's spec (issue 31, item 4). An in-process
daemon on a real socket with vLLM emulators (tests/programs/vllm_emulator.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import tomllib

import psutil
import pytest

import vsup.engine.runner
from vsup.layout.compiled import compile_layout

from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def parses(monkeypatch):
    """Every text tomllib.loads is given in this process, in order."""
    seen: list[str] = []
    real = tomllib.loads

    def loads(text: str, **kw):
        seen.append(text)
        return real(text, **kw)

    monkeypatch.setattr(tomllib, "loads", loads)
    return seen


async def test_an_apply_parses_the_layout_once(daemons, parses):
    daemon, client = await daemons.start()
    text = emulator_layout({"a": free_port()}, extra_header="max_unavailable = 1")
    answer = await client.apply(text, "/tmp/once.toml", dry_run=True)
    assert answer["plan"]["start"] == ["a"] and parses.count(text) == 1
    answer = await client.apply(text, "/tmp/once.toml")
    assert answer["applied"] and parses.count(text) == 2  # one more: one per request
    await daemon.engine.wait("a", ("ready",), timeout=20)
    # what the daemon keeps is the compiled layout: save and the running record need no parse
    assert daemon.layout is not None and daemon.layout.text == text
    assert daemon.layout_toml == text and daemon.layout.rollout.max_unavailable == 1
    await daemon.flush_state()
    assert parses.count(text) == 2


async def test_the_dry_run_says_what_changes_per_instance(daemons):
    daemon, client = await daemons.start()
    ports = {"a": free_port(), "b": free_port()}
    await client.apply(emulator_layout(ports), "/tmp/changes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    await daemon.engine.wait("b", ("ready",), timeout=20)
    changed = emulator_layout(ports, args='args = { say = "v2" }\nenv = { FOO_MODE = "x" }')
    changed = changed.replace('model = "test/fake"', 'model = "test/other"')
    plan = (await client.apply(changed, "/tmp/changes.toml", dry_run=True))["plan"]
    assert plan["restart"] == ["a", "b"]
    assert plan["changes"]["a"] == [
        {"key": "model", "old": "test/fake", "new": "test/other"},
        {"key": "args.say", "old": None, "new": "v2"},
        {"key": "env.FOO_MODE", "old": None, "new": "x"},
    ]
    assert plan["changes"]["b"] == plan["changes"]["a"]
    same = (await client.apply(emulator_layout(ports), "/tmp/changes.toml", dry_run=True))["plan"]
    assert same["unchanged"] == ["a", "b"] and same["changes"] == {}


async def test_an_apply_during_the_spawn_restarts_onto_the_new_spec(daemons, monkeypatch):
    """The second apply's restart arrives while the runner is inside `launch` (in its thread,
    no process recorded yet): the run it starts must end and the new spec run."""
    daemon, client = await daemons.start()
    port = free_port()
    first = emulator_layout({"a": port})
    second = emulator_layout({"a": port}, args='args = { say = "second" }')
    inside = threading.Event()
    real_launch = vsup.engine.runner.launch

    def slow_launch(*args, **kw):
        inside.set()
        time.sleep(0.5)  # the spawn takes its time: the next apply lands meanwhile
        return real_launch(*args, **kw)

    monkeypatch.setattr(vsup.engine.runner, "launch", slow_launch)
    await client.apply(first, "/tmp/spawn.toml")
    assert await asyncio.to_thread(inside.wait, 10)
    answer = await client.apply(second, "/tmp/spawn.toml")
    assert answer["applied"] and answer["plan"]["restart"] == ["a"], answer
    monkeypatch.setattr(vsup.engine.runner, "launch", real_launch)

    compiled, _ = compile_layout(second, "/tmp/spawn.toml")
    assert compiled is not None
    want = compiled.specs[0].argv()

    async def runs_second() -> bool:
        inst = daemon.engine.instances["a"]
        if inst.state != "ready" or inst.pid is None:
            return False
        return psutil.Process(inst.pid).cmdline()[-len(want) :] == want

    for _ in range(200):
        if await runs_second():
            break
        await asyncio.sleep(0.1)
    inst = daemon.engine.instances["a"]
    assert await runs_second(), (
        inst.state,
        psutil.Process(inst.pid).cmdline() if inst.pid else None,
    )
    assert (await client.layout())["toml"] == second
    plan = (await client.apply(first, "/tmp/spawn.toml", dry_run=True))["plan"]
    assert plan["restart"] == ["a"] and plan["changes"]["a"] == [
        {"key": "args.say", "old": "second", "new": None}
    ]


async def test_a_restored_layout_that_no_longer_compiles_is_a_problem_not_silence(
    daemons, vsup_home
):
    """The state file's layout fails to compile on this daemon (a stricter vsup, a GPU gone):
    the operator is told, its alerts and metrics listener still work, `vsup up` replaces it."""
    from vsup import paths
    from vsup.control.state import DaemonState, StateFile

    mport = free_port()
    header = f'metrics_listen = "127.0.0.1:{mport}"\n\n[alerts]\nwebhook_env = "VSUP_TEST_HOOK"\n'
    # two instances on one port: this layout does not validate
    broken = emulator_layout({"a": 8000, "b": 8000}, extra_header=header)
    StateFile(paths.state_path(vsup_home)).save(
        DaemonState(layout_path="/tmp/old.toml", layout_toml=broken, layout_name="fakes")
    )
    daemon, client = await daemons.start()
    assert daemon.layout is None and daemon.layout_toml == broken
    doc = await client.status()
    (problem,) = [a for a in doc["advice"] if a["kind"] == "layout"]
    assert "no longer validates on this node" in problem["message"] and "8000" in problem["message"]
    assert daemon.alerts.config is not None and daemon.alerts.config.webhook_env == "VSUP_TEST_HOOK"
    assert daemon.metrics_listen == ("127.0.0.1", mport) and daemon.metrics.running

    await client.apply(emulator_layout({"a": free_port()}), "/tmp/new.toml")
    assert daemon.layout is not None and daemon.layout.path == "/tmp/new.toml"
    assert not [a for a in (await client.status())["advice"] if a["kind"] == "layout"]
    assert daemon.alerts.config is None and not daemon.metrics.running
