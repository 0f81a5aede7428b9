"""A rolling apply with a canary (engine/canarywatch.py, docs/canary.md) over emulated vLLM
servers: the gate's verdict moves the rollout on or rolls the canary back to its old spec.

The emulator's figures carry no request between two reads (its histograms and request counters
are a recorded payload's), so the gate says "not enough evidence" here and the layout's
`canary_insufficient` decides: that is the path these tests drive. The gate's judgement on
real figures is tests/unit/engine/test_canary_gate.py's; on real vLLM under load,
tests/integration/router/test_router_vsup.py's.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from vsup.engine import Engine
from vsup.engine.rollout import Rollout, RolloutState, plan_waves
from vsup.layout.spec import CanarySettings, RestartPolicy

pytestmark = pytest.mark.timeout(120)


def changed(spec, key: str, value: object = True):
    args = dict(spec.args)
    args[key] = value
    return replace(spec, args=args)


async def three(eng, emulator_spec, **kw):
    specs = [emulator_spec(f"b{i}", "--startup-s", "0.3", **kw) for i in range(3)]
    await eng.apply(specs)
    for s in specs:
        assert await eng.wait(s.name, ("ready", "failed"), timeout=30) == "ready"
    return specs


def test_the_canary_is_the_first_wave_and_one_instance_stays_old():
    assert plan_waves(("a", "b", "c", "d"), 2, canary=1) == [("a",), ("b", "c"), ("d",)]
    assert plan_waves(("a", "b"), 1, canary=5) == [("a",), ("b",)]  # b stays to compare with
    assert plan_waves(("a",), 1, canary=1) == [("a",)]
    r = Rollout(("a", "b", "c"), 1, canary=1, canary_s=30)
    assert r.canaries == ("a",) and Rollout(("a", "b"), 1).canaries == ()
    back = Rollout.from_record({**r.to_record(), "canary_state": "watching"})
    assert back.canaries == ("a",) and back.canary_s == 30 and back.canary_state == "watching"
    assert back.to_json()["canary"] == ["a"]
    # a later daemon may rebuild it from the journal's `rollout` event (to_json) instead
    from_event = Rollout.from_record({**back.to_json(), "done": []})
    assert from_event.canaries == ("a",) and from_event.waves == back.waves


async def test_no_evidence_with_fail_rolls_the_canary_back_and_the_others_never_move(
    engine, emulator_spec, events
):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    pids = {s.name: eng.instances[s.name].pid for s in specs}
    events.items.clear()
    gate = CanarySettings(watch_s=0.5, insufficient="fail")
    await eng.apply([changed(s, "say", "v2") for s in specs], wait=True, canary=gate)
    r = eng.rollout
    assert r.state == RolloutState.ROLLED_BACK and r.canary_state == "failed"
    assert r.failure is not None and r.failure.startswith("canary b0: not enough evidence (")
    assert r.failure.endswith("; rolled back") and r.done == []
    b0 = eng.instances["b0"]
    # the canary runs its old spec again, in a new process; the others were never touched
    assert b0.state == "ready" and "say" not in b0.spec.args and b0.pid != pids["b0"]
    for n in ("b1", "b2"):
        assert eng.instances[n].pid == pids[n] and "say" not in eng.instances[n].spec.args
    (gated,) = events.of("canary")
    assert gated["decision"] == "fail" and gated["action"] == "roll_back"
    assert gated["instances"] == ["b0"] and gated["watched_s"] >= 0.5
    assert events.of("rollout")[-1]["state"] == "rolled_back"
    # b0 went down twice (new spec, then back), b1 and b2 never
    stops = [e["instance"] for e in events.of("state") if e["to"] == "stopping"]
    assert stops == ["b0", "b0"]


async def test_no_evidence_with_pass_goes_on_like_a_rolling_apply(engine, emulator_spec, events):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    events.items.clear()
    gate = CanarySettings(watch_s=0.3, insufficient="pass")
    await eng.apply([changed(s, "say", "v2") for s in specs], wait=True, canary=gate)
    r = eng.rollout
    assert r.state == RolloutState.DONE and r.canary_state == "passed"
    assert all(eng.instances[s.name].spec.args["say"] == "v2" for s in specs)
    (gated,) = events.of("canary")
    assert gated["decision"] == "insufficient" and gated["action"] == "continue"
    # the latencies were compared from the end of the warm-up (a quarter of this short watch)
    assert gated["figures"]["warmup_s"] >= 0.075
    stops = [e["instance"] for e in events.of("state") if e["to"] == "stopping"]
    assert stops == ["b0", "b1", "b2"]


async def test_extend_watches_on_until_its_limit_then_goes_on(engine, emulator_spec, events):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    events.items.clear()
    gate = CanarySettings(watch_s=0.3, insufficient="extend", max_s=1.0)
    await eng.apply([changed(s, "say", "v2") for s in specs], wait=True, canary=gate)
    (gated,) = events.of("canary")
    # extend stops within 50 ms of its limit (canarywatch: `seconds < limit - 0.05`); each
    # extension starts after the readings, so the last one may end a few ms short of max_s
    assert gated["watched_s"] >= 1.0 - 0.05 and gated["decision"] == "insufficient"
    assert eng.rollout.state == RolloutState.DONE


async def test_a_canary_that_crashes_is_rolled_back_at_once(engine, emulator_spec, events):
    eng: Engine = engine()
    policy = RestartPolicy(backoff_s=0.05, backoff_max_s=0.1, stable_s=600, max_failures=5)
    specs = await three(eng, emulator_spec, restart=policy)
    events.items.clear()
    # an hour's watch: only the crash can end it within the test's timeout
    gate = CanarySettings(watch_s=3600, insufficient="pass")
    new = [changed(s, "exit-after", "1.5") for s in specs]  # ready at 0.3 s, gone at 1.5 s
    await eng.apply(new, wait=True, canary=gate)
    r = eng.rollout
    assert r.state == RolloutState.ROLLED_BACK, r.failure
    assert r.failure is not None and "canary b0:" in r.failure and "of watch" in r.failure
    b0 = eng.instances["b0"]
    assert b0.state == "ready" and "exit-after" not in b0.spec.args
    assert all("exit-after" not in eng.instances[n].spec.args for n in ("b1", "b2"))


async def test_a_canary_that_never_comes_ready_is_rolled_back(engine, emulator_spec, events):
    eng: Engine = engine()
    policy = RestartPolicy(backoff_s=0.05, backoff_max_s=0.1, stable_s=600, max_failures=2)
    specs = await three(eng, emulator_spec, restart=policy)
    events.items.clear()
    gate = CanarySettings(watch_s=60)
    new = [changed(s, "exit-after", "0.1") for s in specs]  # dies before it is ready
    await eng.apply(new, wait=True, canary=gate)
    r = eng.rollout
    assert r.state == RolloutState.ROLLED_BACK
    assert r.failure == "canary b0: failed on the new spec (did not come back ready); rolled back"
    assert eng.instances["b0"].state == "ready"
    assert "exit-after" not in eng.instances["b0"].spec.args


async def test_an_operator_ends_the_watch_early_either_way(engine, emulator_spec, events):
    eng: Engine = engine()
    specs = await three(eng, emulator_spec)
    assert not eng.end_canary_watch(True)  # nothing watched
    gate = CanarySettings(watch_s=300, insufficient="pass")
    await eng.apply([changed(s, "say", "v2") for s in specs], canary=gate)
    await events.wait(lambda e: e["kind"] == "rollout" and e.get("canary_state") == "watching")
    assert eng.end_canary_watch(promote=True)
    assert eng._rollout_task is not None
    await asyncio.wait_for(eng._rollout_task, 60)
    assert eng.rollout.state == RolloutState.DONE
    assert events.of("canary")[-1]["reason"].startswith("canary b0: promoted by hand after")
    await eng.apply([changed(s, "say", "v3") for s in specs], canary=gate)
    await events.wait(
        lambda e: (
            e["kind"] == "rollout"
            and e.get("canary_state") == "watching"
            and e.get("state") == "running"
            and e.get("started_at") == eng.rollout.started_at
        )
    )
    assert eng.end_canary_watch(promote=False)
    assert eng._rollout_task is not None
    await asyncio.wait_for(eng._rollout_task, 60)
    assert eng.rollout.state == RolloutState.ROLLED_BACK
    assert eng.instances["b0"].spec.args["say"] == "v2"
    assert eng.rollout.failure.startswith("canary b0: aborted by hand after")
