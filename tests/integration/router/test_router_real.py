"""vllm-router (the real binary) in front of two real CPU vLLM replicas, driven by vsup.router.

One module-scoped pair of replicas and one router, all on 127.0.0.1; the tests run in file order
and the replica crash comes last (its replica stays down). Figures are printed (`-s`) and kept
in docs/router.md. Removal under load with the engine driving it (leave, drain, restart,
rejoin, no request lost): test_router_vsup.py's rolling apply.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import httpx
import pytest

from vsup.layout.model import loads_layout
from vsup.router import RouterClient, RouterMembership, RouterSpec, router_spec

from tests.conftest import free_port
from tests.programs.router_fleet import (
    VLLM_ENV,
    completion_body,
    kill_group,
    router_command,
    spawn,
    steady_load,
    stop_group,
    vllm_argv,
    wait_http,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
# the CPU build's worker inside its EngineCore, as on a GPU at TP1 (tests/conftest.py, vllm_env):
# this module tests the router in front of vLLM's HTTP API, not vLLM's process tree (the crash
# test SIGKILLs a replica's whole process group either way), and a start costs less that way
VLLM_ONE_PROCESS = True


@dataclass
class Fleet:
    model: str
    urls: dict[str, str]
    procs: dict[str, Popen]
    logs: Path


@dataclass
class Router:
    spec: RouterSpec
    proc: Popen
    log: Path

    def client(self) -> RouterClient:
        return RouterClient(self.spec.base_url, self.spec.metrics_url)


@pytest.fixture(scope="module")
def fleet(
    tiny_model: Path, vllm_env: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("fleet")
    ports = {"r0": free_port(), "r1": free_port()}
    procs: dict[str, Popen] = {}
    try:
        for i, (name, port) in enumerate(ports.items()):
            # one core each: vLLM CPU binds every instance's OpenMP threads to core 0 by default
            bind = str(i % max(1, os.cpu_count() or 1))
            env = {**VLLM_ENV, **vllm_env, "VLLM_CPU_OMP_THREADS_BIND": bind}
            procs[name] = spawn(vllm_argv(tiny_model, port), logs / f"{name}.log", env)
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        for name, url in urls.items():
            wait_http(f"{url}/health", 300, procs[name])
        yield Fleet(str(tiny_model), urls, procs, logs)
    finally:
        for proc in procs.values():
            stop_group(proc)


@pytest.fixture(scope="module")
def router(fleet: Fleet) -> Iterator[Router]:
    ports = {name: int(url.rsplit(":", 1)[1]) for name, url in fleet.urls.items()}
    command = router_command()
    text = f"""\
[defaults]
model = "{fleet.model}"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"

[[instance]]
name = "r0"
gpus = []
port = {ports["r0"]}

[[instance]]
name = "r1"
gpus = []
port = {ports["r1"]}

[router]
port = {free_port()}
metrics_port = {free_port()}
host = "127.0.0.1"
policy = "round_robin"
command = {command!r}
""".replace("'", '"')
    layout = loads_layout(text)
    spec = router_spec(layout, layout.resolve())
    log = fleet.logs / "router.log"
    proc = spawn(spec.argv(list(spec.workers.values())), log)
    assert spec is not None
    state = Router(spec, proc, log)
    try:
        wait_http(f"{spec.base_url}/readiness", 60, proc)
        yield state
    finally:
        stop_group(state.proc, grace_s=10)


def replica_counter(url: str, name: str) -> float:
    """Sum of one vLLM counter/gauge over its label sets, from the replica's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def finished(url: str) -> float:
    return replica_counter(url, "vllm:request_success_total")


def running(url: str) -> float:
    return replica_counter(url, "vllm:num_requests_running") + replica_counter(
        url, "vllm:num_requests_waiting"
    )


READY = {"r0": "ready", "r1": "ready"}


async def test_requests_through_the_router_reach_both_replicas(fleet: Fleet, router: Router):
    before = {n: finished(u) for n, u in fleet.urls.items()}
    async with httpx.AsyncClient(timeout=60) as http:
        for _ in range(8):
            resp = await http.post(
                f"{router.spec.base_url}/v1/completions", json=completion_body(fleet.model, 4)
            )
            assert resp.status_code == 200, resp.text
    delta = {n: finished(u) - before[n] for n, u in fleet.urls.items()}
    assert delta == {"r0": 4, "r1": 4}  # round_robin
    client = router.client()
    try:
        metrics = await client.metrics()
        assert await client.add_worker(fleet.urls["r0"]) is False  # already there
        await client.remove_worker("http://127.0.0.1:9")  # unknown: a no-op, not an error
        assert sorted(await client.list_workers()) == sorted(fleet.urls.values())
        assert await client.alive()
    finally:
        await client.aclose()
    share = metrics.worker_share()
    assert set(share) == set(fleet.urls.values())
    assert all(s > 0 for s in share.values())
    assert metrics.active_workers == 2


async def test_the_router_sigkilled_comes_back_with_the_same_workers(fleet: Fleet, router: Router):
    client = router.client()
    try:
        before = sorted(await client.list_workers())
        assert before == sorted(fleet.urls.values())
        kill_group(router.proc)
        assert not await client.alive()
        membership = RouterMembership(router.spec.workers)
        t0 = time.monotonic()
        router.proc = spawn(router.spec.argv(membership.desired(READY)), router.log)
        await asyncio.to_thread(wait_http, f"{router.spec.base_url}/readiness", 60, router.proc)
        back_s = time.monotonic() - t0
        assert sorted(await client.list_workers()) == before
        assert not await membership.reconcile(client, READY)
        async with httpx.AsyncClient(timeout=60) as http:
            resp = await http.post(
                f"{router.spec.base_url}/v1/completions", json=completion_body(fleet.model, 2)
            )
        assert resp.status_code == 200
        # a router started with no worker is serving as soon as membership adds them
        kill_group(router.proc)
        t0 = time.monotonic()
        router.proc = spawn(router.spec.argv([]), router.log)
        await asyncio.to_thread(wait_http, f"{router.spec.base_url}/liveness", 60, router.proc)
        change = await membership.reconcile(client, READY)
        empty_back_s = time.monotonic() - t0
        assert sorted(change.add) == before
        assert sorted(await client.list_workers()) == before
        print(
            f"\nrouter restart: ready in {back_s:.2f} s (workers in argv), {empty_back_s:.2f} s "
            "(empty argv + add_worker calls)"
        )
    finally:
        await client.aclose()


async def test_a_replica_sigkilled_under_load_costs_a_handful_of_requests(
    fleet: Fleet, router: Router
):
    membership = RouterMembership(router.spec.workers)
    client = router.client()
    states = dict(READY)
    removed_at: list[float] = []

    async def vsup_sees_the_exit() -> None:
        # What the engine does: the exit (pidfd) turns the instance to backoff at once, and
        # membership follows.
        while fleet.procs["r1"].poll() is None:
            await asyncio.sleep(0.05)
        states["r1"] = "backoff"
        await membership.reconcile(client, states)
        removed_at.append(time.monotonic())

    async def crash_later() -> float:
        await asyncio.sleep(4)
        t = time.monotonic()
        await asyncio.to_thread(kill_group, fleet.procs["r1"])
        return t

    try:
        watcher = asyncio.create_task(vsup_sees_the_exit())
        load, killed_at = await asyncio.gather(
            steady_load(router.spec.base_url, fleet.model, duration_s=14, concurrency=4),
            crash_later(),
        )
        await asyncio.wait_for(watcher, 30)
        assert await client.list_workers() == [fleet.urls["r0"]]
    finally:
        await client.aclose()
    late = [t - killed_at for t, ok in load.timeline if not ok]
    print(
        f"\nreplica SIGKILL under load: {load.ok} ok, {load.failed} failed "
        f"(at +{', +'.join(f'{x:.2f}' for x in late) or '-'} s), "
        f"removed from the router {removed_at[0] - killed_at:.2f} s after the kill; "
        f"errors: {load.errors[:3]}"
    )
    assert load.failed <= 5
    assert load.ok >= 20
    assert finished(fleet.urls["r0"]) > 0
