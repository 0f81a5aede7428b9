"""The engine runs the real vllm-router (the `router` extra) in front of vLLM emulator
instances: supervision (SIGKILL -> restarted, adoption by a new engine, stop) and a worker set
that follows the instances' states. Real vLLM behind the router: tests/integration/router."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vsup.engine import routing
from vsup.engine.routing import ROUTER_NAME
from vsup.layout.spec import RestartPolicy
from vsup.router import RouterClient, RouterSpec

from tests.integration.engine.conftest import pid_alive
from tests.integration.engine.test_processes import until
from tests.programs.intruder import ForeignServer, Stream, add_worker, listed, stream

ROUTER = Path(sys.executable).parent / "vllm-router"
pytestmark = pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router (the router extra)")


def router_spec(port_factory, token: str, specs) -> RouterSpec:
    return RouterSpec(
        port=port_factory(),
        metrics_port=port_factory(),
        host="127.0.0.1",
        policy="round_robin",
        command=(str(ROUTER),),
        env={"VSUP_TEST_TOKEN": token},
        restart=RestartPolicy(backoff_s=0.05, backoff_max_s=0.2),
        workers={s.name: s.base_url for s in specs},
    )


async def workers(spec: RouterSpec) -> list[str]:
    client = RouterClient(spec.base_url)
    try:
        return sorted(await client.list_workers())
    finally:
        await client.aclose()


async def until_workers(spec: RouterSpec, want: list[str], timeout: float = 30) -> None:
    async def check() -> None:
        while True:
            try:
                if await workers(spec) == sorted(want):
                    return
            except Exception:
                pass
            await asyncio.sleep(0.05)

    await asyncio.wait_for(check(), timeout)


async def test_the_router_serves_the_ready_instances_and_follows_their_states(
    engine, emulator_spec, port_factory, token, events
):
    eng = engine()
    a, b = emulator_spec("a"), emulator_spec("b")
    spec = router_spec(port_factory, token, [a, b])
    assert await eng.router.apply(spec) == "start"
    await eng.apply([a, b], wait=True)
    await until(lambda: eng.router.inst.state == "ready", timeout=60)
    await until_workers(spec, [a.base_url, b.base_url])
    assert eng.router.inst.log_path().parent.name == ROUTER_NAME

    # a person's stop: out of the router before the instance is touched, back once ready
    await eng.stop("a")
    assert await workers(spec) == [b.base_url]
    (removal,) = [e for e in events.of("router_workers") if e["remove"] == [a.base_url]][:1]
    stop_action = next(e for e in events.of("action", "a") if e["action"] == "stop")
    assert events.items.index(
        next(x for x in events.items if x[1] is removal)
    ) < events.items.index(next(x for x in events.items if x[1] is stop_action))
    await eng.start("a", wait=True)
    await until_workers(spec, [a.base_url, b.base_url])

    # a crash: the exit takes it out; the restart brings it back
    os.kill(eng.instances["b"].pid, signal.SIGKILL)
    await until_workers(spec, [a.base_url], timeout=10)
    await eng.wait("b", ("ready",), timeout=30)
    await until_workers(spec, [a.base_url, b.base_url])

    status = eng.router.status_json("node")
    assert status.state == "ready" and status.endpoint == spec.base_url
    assert [w.name for w in status.workers] == ["a", "b"]


async def test_the_router_sigkilled_is_restarted_with_its_workers(
    engine, emulator_spec, port_factory, token, events
):
    eng = engine()
    a = emulator_spec("a")
    spec = router_spec(port_factory, token, [a])
    await eng.router.apply(spec)
    await eng.apply([a], wait=True)
    await until_workers(spec, [a.base_url], timeout=60)
    first = eng.router.inst.pid
    t0 = time.monotonic()
    os.killpg(first, signal.SIGKILL)
    await until(lambda: eng.router.inst.pid not in (None, first), timeout=30)
    await until_workers(spec, [a.base_url], timeout=60)
    back_s = time.monotonic() - t0
    print(f"\nrouter SIGKILL -> serving its worker again after {back_s:.2f} s")
    assert eng.router.inst.restarts == 1
    exits = [e for e in events.of("exit") if e.get("router")]
    assert exits and exits[0]["signal"] == "SIGKILL"
    assert all("instance" not in e for e in exits)


async def test_a_new_engine_adopts_the_running_router(
    engine, emulator_spec, port_factory, token, tmp_path
):
    first = engine()
    a = emulator_spec("a")
    spec = router_spec(port_factory, token, [a])
    await first.router.apply(spec)
    await first.apply([a], wait=True)
    await until_workers(spec, [a.base_url], timeout=60)
    record = first.router.inst.adopt_record()
    inst_record = first.instances["a"].adopt_record()
    pid = record.pid
    await first.shutdown(stop_instances=False)  # the daemon detaches
    assert pid_alive(pid)

    second = engine()
    second.adopt(a, inst_record)
    assert second.router.adopt(spec, record)
    await until(lambda: second.router.inst.state == "ready", timeout=30)
    assert second.router.inst.pid == pid and second.router.inst.restarts == 0
    await until_workers(spec, [a.base_url])
    await second.shutdown(stop_instances=True)
    await until(lambda: not pid_alive(pid), timeout=20)


async def test_a_rollout_takes_the_next_replica_out_only_once_the_last_is_back_in_the_router(
    engine, emulator_spec, port_factory, token, events
):
    eng = engine()
    specs = [emulator_spec(n, "--startup-s", "0.3") for n in ("a", "b")]
    spec = router_spec(port_factory, token, specs)
    await eng.router.apply(spec)
    await eng.apply(specs, wait=True)
    await until_workers(spec, [s.base_url for s in specs], timeout=60)
    changed = [replace(s, args={**s.args, "say": "v2"}) for s in specs]
    await eng.apply(changed, wait=True)
    assert eng.rollout.state == "done"
    await until_workers(spec, [s.base_url for s in specs])
    moves = [
        (u, kind)
        for e in events.of("router_workers")
        for kind in ("remove", "add")
        for u in e[kind]
    ]
    a, b = specs[0].base_url, specs[1].base_url
    # a leaves, comes back, and only then b leaves: the router always had a worker
    order = [m for m in moves if m in ((a, "remove"), (a, "add"), (b, "remove"))]
    assert order[-3:] == [(a, "remove"), (a, "add"), (b, "remove")]


async def test_a_worker_someone_else_adds_is_removed_at_once_and_reported(
    engine, emulator_spec, port_factory, token, events, monkeypatch
):
    """vllm-router's worker API has no authentication: anyone who reaches its port can add a
    server of their own. vsup removes it at once (its watch reads the worker list every
    WATCH_S, not at the 10 s recheck), journals it, and keeps it for the advice; a request
    stream through the router sees no request reach it after that. Then an add_worker loop:
    it keeps coming back, vsup keeps removing it, and the journal gets one event, not one per
    removal. Figures are printed (docs/router.md); the time it takes is
    benchmarks/router_foreign.py's."""
    # "at once": with the periodic recheck an hour away, only the watch can remove it
    monkeypatch.setattr(routing, "RECHECK_S", 3600.0)
    eng = engine()
    a = emulator_spec("a")
    spec = router_spec(port_factory, token, [a])
    await eng.router.apply(spec)
    await eng.apply([a], wait=True)
    await until_workers(spec, [a.base_url], timeout=60)
    async with ForeignServer(port_factory()) as intruder:
        load = Stream()
        sending = asyncio.create_task(stream(spec.base_url, a.model, load))
        try:
            await until(lambda: load.sent > 5, timeout=30)
            assert await add_worker(spec.base_url, intruder.url) == 200
            added = time.monotonic()
            deadline = added + 60  # generous: the recheck that could also remove it is off
            while intruder.url in await listed(spec.base_url):
                assert time.monotonic() < deadline, "the foreign worker was not removed"
                await asyncio.sleep(0.005)
            gone = time.monotonic()
            (event,) = await events.wait(lambda e: e["kind"] == "router_foreign_worker", timeout=5)
            # the request in flight at the removal may still reach it; none sent after it
            settled = load.sent + 2
            await until(lambda: load.sent >= settled, timeout=30)
            hits, sent = intruder.hits, load.sent
            await until(lambda: load.sent >= sent + 20, timeout=60)
            assert intruder.hits == hits, "requests reached the removed worker"
            first = (gone - added, hits, sent)

            # a loop of add_worker, as the audit ran it
            t0, loop_hits, loop_sent, adds = time.monotonic(), intruder.hits, load.sent, 0
            while time.monotonic() - t0 < 4:
                adds += await add_worker(spec.base_url, intruder.url) == 200
            loop_s = time.monotonic() - t0
            got, of = intruder.hits - loop_hits, load.sent - loop_sent
            while intruder.url in await listed(spec.base_url):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # the request in flight
            hits, sent = intruder.hits, load.sent
            await until(lambda: load.sent >= sent + 20, timeout=60)
            assert intruder.hits == hits, "requests reached the removed worker"
        finally:
            load.stop.set()
            await sending
    assert event["url"] == intruder.url and event["router"] == spec.port
    assert event["removals"] == 1 and "instance" not in event
    assert load.failed == 0
    assert adds > 1 and eng.router.foreign[intruder.url].removals >= adds
    # one incident: its first removal is news, the loop's dozens of removals are not
    assert len(events.of("router_foreign_worker")) == 1
    (recent,) = eng.router.foreign_recent()
    assert recent.url == intruder.url and recent.router_port == spec.port
    router = eng.router.status_json("node")
    assert router is not None
    (shown,) = router.foreign_workers
    assert shown.url == intruder.url and shown.removals == recent.removals
    print(
        f"\nforeign worker: removed {first[0] * 1000:.0f} ms after its add_worker answered; "
        f"{first[1]} of {first[2]} streamed requests reached it. add_worker loop for "
        f"{loop_s:.1f} s: {adds} adds got in, {got} of {of} requests reached it"
    )


RESTARTS = 3  # each policy twice or once: a start of vllm-router is ~4 s of this test's time


async def test_a_restarted_router_is_seen_listening_at_once(
    engine, emulator_spec, port_factory, token, events, monkeypatch
):
    """While the router restarts every request to it fails, so vsup asks whether it listens
    every START_POLL_S (50 ms), not at its health interval, and hands it its workers right away.
    Proven without a clock: the health interval is an hour here, so a start seen only at a
    health poll would never be `ready` in time. The lag from its first answer to `ready` is
    printed; what a restart costs clients is benchmarks/router_restart.py's."""
    monkeypatch.setattr(routing, "ROUTER_HEALTH_INTERVAL_S", 3600.0)
    import threading

    import httpx

    eng = engine()
    a = emulator_spec("a")
    spec = router_spec(port_factory, token, [a])
    await eng.router.apply(spec)
    await eng.apply([a], wait=True)
    await until_workers(spec, [a.base_url], timeout=60)

    answered: list[float] = []  # when /liveness answered 200, from a thread of its own
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=1.0) as http:
            while not done.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{spec.base_url}/liveness").status_code == 200:
                        answered.append(time.monotonic())
                done.wait(0.01)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    lags = []
    try:
        for i in range(RESTARTS):
            run = eng.router.inst.run
            policy = "random" if i % 2 == 0 else "round_robin"
            assert await eng.router.apply(replace(spec, policy=policy)) == "restart"
            await events.wait(
                lambda e, r=run: e["kind"] == "ready" and e.get("router") and e.get("run") == r + 1
            )
            (exited,) = [
                t for t, e in events.stamped("exit") if e.get("router") and e["run"] == run
            ]
            (ready,) = [
                t for t, e in events.stamped("ready") if e.get("router") and e["run"] == run + 1
            ]
            # the probe thread may see the new router a moment after vsup did (a loaded
            # machine); its first answer after the exit is what the lag is measured from
            deadline = time.monotonic() + 30
            while not any(t > exited for t in answered):
                assert time.monotonic() < deadline, "the probe never saw the new router answer"
                await asyncio.sleep(0.01)
            first = min(t for t in answered if t > exited)
            lags.append(ready - first)
            await until_workers(replace(spec, policy=policy), [a.base_url], timeout=30)
    finally:
        done.set()
        thread.join()
    print(f"\nrouter answered -> vsup saw it ready: {[round(x, 3) for x in lags]} s")
    assert len(lags) == RESTARTS and eng.router.inst.spec.health_interval_s == 3600.0
