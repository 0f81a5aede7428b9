"""A restart asked for while the runner is still spawning (no process yet) is not lost: the intent
keeps it until the runner takes it, so the instance ends up running what was asked last, and a
diff against it says so (issue 31, item 4: two applies 0-20 ms apart)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import vsup.engine.runner as runner_module
from vsup.engine.intent import Run

from tests.integration.engine.test_processes import until


async def test_a_restart_asked_during_the_spawn_restarts_into_the_new_spec(
    engine, emulator_spec, events, monkeypatch
):
    real_launch = runner_module.launch
    in_launch = threading.Event()
    release = threading.Event()

    def held_launch(*args, **kw):
        # the spawn of the first run waits until the test has asked for the restart
        in_launch.set()
        assert release.wait(30)
        return real_launch(*args, **kw)

    monkeypatch.setattr(runner_module, "launch", held_launch)
    eng = engine()
    v1 = emulator_spec("a", "--say", "layout-v1")
    v2 = replace(v1, args={**v1.args, "say": "layout-v2"})
    await eng.apply([v1])
    await asyncio.to_thread(in_launch.wait, 30)
    inst = eng.instances["a"]
    assert inst.process is None and inst.state == "starting"  # the spawn is under way

    plan = await eng.apply([v2])  # the second apply, while the first spawn runs
    assert plan.restart == ("a",)
    monkeypatch.setattr(runner_module, "launch", real_launch)
    release.set()

    await events.wait(lambda e: e["kind"] == "spawn" and e.get("instance") == "a", count=2)
    await eng.wait("a", ("ready",), timeout=30)
    await until(lambda: isinstance(inst.control.intent, Run))
    assert inst.spec == v2
    assert "layout-v2" in inst.log_path().read_text()
    assert eng.diff([v2]).unchanged == ("a",)
    assert eng.diff([v1]).restart == ("a",)  # what runs is v2, and the diff says so
