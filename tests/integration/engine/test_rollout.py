"""Rolling apply (engine/rollout.py) with emulated vLLM servers: waves, drain, failure, supersede.

The emulator (tests/programs/vllm_emulator.py) starts in a set fraction of a second, so the
waves can be watched through the engine's own `state` events: at no moment may more than
`max_unavailable` instances of the rollout be out of `ready` because of it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest

from vsup.engine import Engine
from vsup.engine.rollout import Rollout, RolloutState, plan_waves
from vsup.layout.spec import RestartPolicy

pytestmark = pytest.mark.timeout(120)


def test_waves_follow_the_layout_order_in_groups_of_max_unavailable():
    assert plan_waves(("a", "b", "c", "d", "e"), 2) == [("a", "b"), ("c", "d"), ("e",)]
    assert plan_waves(("a",), 3) == [("a",)]
    with pytest.raises(ValueError, match="max_unavailable must be 1 or more"):
        plan_waves(("a",), 0)
    r = Rollout(("a", "b", "c"), 2)
    assert r.to_json()["waves"] == 2 and r.pending == ("a", "b", "c")
    r.begin_wave(1)
    assert (r.current, r.pending) == (("a", "b"), ("c",))  # type: ignore[comparison-overlap]  # r.pending stays narrowed across begin_wave()
    r.wave_ready()
    assert r.to_json()["done"] == 2 and r.to_json()["state"] == "running"


def changed(spec, *more: str):
    """The same instance with one more vLLM flag: a process-defining change."""
    args = dict(spec.args)
    args[more[0].lstrip("-")] = more[1] if len(more) > 1 else True
    return replace(spec, args=args)


def down_counts(events, names) -> list[int]:
    """How many of `names` were out of `ready` after each state event, in order."""
    ready = dict.fromkeys(names, True)
    counts = []
    for e in events.of("state"):
        if e["instance"] in ready:
            ready[e["instance"]] = e["to"] == "ready"
            counts.append(sum(1 for ok in ready.values() if not ok))
    return counts


async def ready_all(eng, names):
    for n in names:
        assert await eng.wait(n, ("ready", "failed"), timeout=30) == "ready"


async def three(eng, emulator_spec, **kw):
    specs = [emulator_spec(f"b{i}", "--startup-s", "0.3", **kw) for i in range(3)]
    await eng.apply(specs)
    await ready_all(eng, [s.name for s in specs])
    return specs


async def test_a_changed_layout_restarts_serving_instances_one_wave_at_a_time(
    engine, emulator_spec, events
):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    names = [s.name for s in specs]
    pids = {n: eng.instances[n].pid for n in names}
    events.items.clear()
    new = [changed(s, "--say", "v2") for s in specs]
    plan = eng.diff(new)
    assert plan.restart == plan.rolling == tuple(names)
    await eng.apply(new, wait=True)
    assert eng.rollout.state == RolloutState.DONE
    assert eng.rollout.to_json()["done"] == 3 and eng.rollout.to_json()["waves"] == 3
    for n in names:
        inst = eng.instances[n]
        assert inst.state == "ready" and inst.pid != pids[n]
        assert inst.spec.args["say"] == "v2"
    counts = down_counts(events, names)
    assert counts and max(counts) == 1, counts
    # each instance came back before the next one went down: stop order = layout order
    stops = [e["instance"] for e in events.of("state") if e["to"] == "stopping"]
    readies = [e["instance"] for e in events.of("ready")]
    assert stops == names and readies == names
    # the rollout said what it did, wave by wave
    waves = [(e["wave"], tuple(e["current"])) for e in events.of("rollout") if e["current"]]
    assert [w for w in waves if w[1]] == [(1, ("b0",)), (2, ("b1",)), (3, ("b2",))]


async def test_max_unavailable_two_takes_two_down_together(engine, emulator_spec, events):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    events.items.clear()
    await eng.apply([changed(s, "--say", "v2") for s in specs], wait=True, max_unavailable=2)
    assert eng.rollout.state == RolloutState.DONE and len(eng.rollout.waves) == 2
    counts = down_counts(events, [s.name for s in specs])
    assert max(counts) == 2, counts


async def test_each_instance_is_drained_before_its_restart(engine, emulator_spec, events):
    """b0 runs a request until a helper ends it: its drain waits for that. b1 and b2 run none:
    their drains end on the first reads of 0 (one, or two where a 0 must be confirmed), never
    polling on. (How long a drain takes is in docs/benchmarks.md, `benchmarks.drain_gauges`.)"""
    running = {"b0": 1.0, "b1": 0.0, "b2": 0.0}
    reads: Counter[str] = Counter()

    def requests_running(name):
        reads[name] += 1
        return running.get(name)

    eng: Engine = engine(requests_running=requests_running)
    specs = await three(eng, emulator_spec)
    reads.clear()

    async def finish_b0_requests():
        await events.wait(lambda e: e["kind"] == "action" and e.get("instance") == "b0")
        await asyncio.sleep(0.3)
        running["b0"] = 0.0

    helper = asyncio.create_task(finish_b0_requests())
    await eng.apply([changed(s, "--say", "v2") for s in specs], wait=True, drain_timeout_s=20)
    await helper
    drains = {e["instance"]: e for e in events.of("drain")}
    assert set(drains) == {"b0", "b1", "b2"}
    assert drains["b0"]["drained"] is True and drains["b0"]["requests"] == 1
    assert drains["b0"]["waited_s"] >= 0.25  # it waited for the request (a lower bound)
    for idle in ("b1", "b2"):
        assert drains[idle]["drained"] is True and drains[idle]["requests"] == 0, drains[idle]
        assert 1 <= reads[idle] <= 2, reads  # the zero, and at most its confirmation


async def test_the_layouts_drain_limit_bounds_the_wait(engine, emulator_spec, events):
    """Requests never end here, so each drain can only end at the layout's limit (0.2 s, not
    the instance's own drain_timeout_s): it reports not drained after a read at the start and
    one at the limit, no more polls (0.5 s apart) than the limit leaves room for."""
    reads: Counter[str] = Counter()

    def never_drains(name):
        reads[name] += 1
        return 3.0

    eng: Engine = engine(requests_running=never_drains)
    specs = await three(eng, emulator_spec)
    reads.clear()
    await eng.apply([changed(s, "--say", "v2") for s in specs], wait=True, drain_timeout_s=0.2)
    drains = events.of("drain")
    assert len(drains) == 3 and all(d["drained"] is False for d in drains)
    assert all(d["waited_s"] >= 0.15 for d in drains)  # it did wait (a lower bound)
    assert dict(reads) == {"b0": 2, "b1": 2, "b2": 2}, reads
    assert eng.rollout.state == RolloutState.DONE


async def test_a_failed_wave_stops_the_rollout_and_the_rest_keep_serving(
    engine, emulator_spec, events
):
    eng: Engine = engine()
    policy = RestartPolicy(backoff_s=0.05, backoff_max_s=0.1, stable_s=600, max_failures=2)
    specs = await three(eng, emulator_spec, restart=policy)
    pids = {s.name: eng.instances[s.name].pid for s in specs}
    new = [changed(specs[0], "--say", "v2"), changed(specs[1], "--exit-after", "0.1")]
    new.append(changed(specs[2], "--say", "v2"))
    await eng.apply(new, wait=True)
    r = eng.rollout
    assert r.state == RolloutState.FAILED
    assert r.done == ["b0"] and r.current == ("b1",) and r.pending == ("b2",)
    assert r.failure is not None
    assert "wave 2/3 failed: b1 is failed" in r.failure
    assert "b2 keep their old config and keep serving" in r.failure
    b2 = eng.instances["b2"]
    assert b2.state == "ready" and b2.pid == pids["b2"] and "say" not in b2.spec.args
    assert eng.instances["b0"].spec.args["say"] == "v2"
    assert events.of("rollout")[-1]["state"] == "failed"


async def test_all_at_once_restarts_every_changed_instance_together(engine, emulator_spec, events):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    events.items.clear()
    new = [changed(s, "--say", "v2") for s in specs]
    plan = await eng.apply(new, wait=True, rolling=False)
    assert plan.rolling == () and plan.restart == ("b0", "b1", "b2")
    assert max(down_counts(events, [s.name for s in specs])) == 3
    assert eng.rollout is None


async def test_a_new_apply_supersedes_the_rollout_without_more_down_at_once(
    engine, emulator_spec, events
):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    names = [s.name for s in specs]
    events.items.clear()
    await eng.apply([changed(s, "--say", "v2") for s in specs])
    first = eng.rollout
    await events.wait(lambda e: e["kind"] == "state" and e["to"] == "stopping")
    final = [changed(s, "--say", "v3") for s in specs]
    await eng.apply(final, wait=True)
    assert first.state == RolloutState.SUPERSEDED
    assert eng.rollout.state == RolloutState.DONE
    assert all(eng.instances[n].spec.args["say"] == "v3" for n in names)
    assert max(down_counts(events, names)) == 1


async def test_new_and_idle_instances_start_at_once_beside_a_rollout(engine, emulator_spec, events):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    await eng.stop("b2")
    extra = emulator_spec("c0")
    new = [changed(s, "--say", "v2") for s in specs] + [extra]
    plan = eng.diff(new)
    assert plan.rolling == ("b0", "b1") and set(plan.start) == {"b2", "c0"}
    await eng.apply(new, wait=True)
    assert all(eng.instances[n].state == "ready" for n in ("b0", "b1", "b2", "c0"))
    assert eng.rollout.total == 2 and eng.rollout.state == RolloutState.DONE


async def test_an_instance_a_person_stopped_meanwhile_is_left_stopped_with_the_new_spec(
    engine, emulator_spec, events
):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    new = [changed(s, "--say", "v2") for s in specs]
    await eng.apply(new)
    await eng.stop("b2")  # before its wave
    await eng.settle("b2", timeout=20)
    await until_rollout_ends(eng)
    assert eng.rollout.state == RolloutState.DONE
    b2 = eng.instances["b2"]
    assert b2.state == "stopped" and b2.spec.args["say"] == "v2"
    assert eng.diff(new).start == ("b2",)


async def until_rollout_ends(eng, timeout=30.0):
    async def loop():
        while eng.rollout.active:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), timeout)
