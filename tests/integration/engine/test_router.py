"""The engine runs the real vllm-router (the `router` extra) in front of vLLM emulator
instances: supervision (SIGKILL -> restarted, adoption by a new engine, stop) and a worker set
that follows the instances' states. Real vLLM behind the router: tests/integration/router."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vsup.engine.routing import ROUTER_NAME
from vsup.layout.spec import RestartPolicy
from vsup.router import RouterClient, RouterSpec

from tests.integration.engine.conftest import pid_alive
from tests.integration.engine.test_processes import until

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
