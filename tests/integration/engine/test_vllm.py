"""The engine with real vLLM servers (CPU build, the generated tiny model).

Real starts take ~30 s each on the shared machine, so one module-scoped pair of instances
carries the scenarios that need a healthy server (serve, SIGKILL, engine death, stop), and the
start-up failures get one short-lived instance each. Run under `flock /tmp/vsup-vllm.lock`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from vsup.clock import SystemClock
from vsup.engine import Engine, EngineSettings
from vsup.layout.spec import InstanceSpec, RestartPolicy

from tests.integration.engine.conftest import Events, group_members, kill_token, pid_alive
from tests.ports import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
MODULE = pytest.mark.asyncio(loop_scope="module")
# The CPU build's three processes (API server, EngineCore, worker), the children forked as on a
# GPU node rather than spawned (tests/conftest.py `vllm_env`): what is tested here is the
# tree, its sweep and its exit reasons. The shipped `cpu` profile (test_cpu_node_vllm.py), the
# install test and the demo run the CPU build's spawn as it comes.
VLLM_FORK_CORE = True


def vllm_spec(name, model, command, env, token, **kw) -> InstanceSpec:
    args = {"dtype": "float32", "enforce-eager": True, "max-model-len": 512}
    args.update(kw.pop("args", {}))
    base = dict(
        name=name,
        model=str(model),
        command=tuple(command),
        host="127.0.0.1",
        port=free_port(),
        gpus=(),
        gpu_memory_utilization=None,
        args=args,
        env={**env, "VSUP_TEST_TOKEN": token},
        restart=RestartPolicy(backoff_s=1, backoff_max_s=5, stable_s=600, max_failures=3),
        start_timeout_s=240,
        stop_grace_s=15,
        health_interval_s=0.5,
        unhealthy_after=2,
    )
    base.update(kw)
    return InstanceSpec(**base)


@pytest.fixture(scope="module")
def module_token():
    tok = uuid.uuid4().hex
    yield tok
    assert not kill_token(tok), "vLLM processes were left behind"


@pytest.fixture
def token():
    tok = uuid.uuid4().hex
    yield tok
    assert not kill_token(tok), "vLLM processes were left behind"


async def test_bad_model_path_fails_fast_with_model_not_found(
    vllm_command, vllm_env, token, tmp_path
):
    events = Events()
    engine = Engine(SystemClock(), tmp_path / "logs", events)
    missing = tmp_path / "no-such-model"
    spec = vllm_spec("bad", missing, vllm_command, vllm_env, token)
    try:
        await engine.apply([spec])
        assert await engine.wait("bad", ("failed",), timeout=240) == "failed"
        assert await engine.settle("bad", timeout=60) == "failed"
        inst = engine.instances["bad"]
        assert inst.last_exit.reason == "model_not_found"
        assert inst.last_exit.log_excerpt is not None
        assert "Repo id must be in the form" in inst.last_exit.log_excerpt
        assert str(missing) in inst.last_exit.log_excerpt
        assert len(events.of("spawn")) == 1 and not inst.supervised  # max_failures is 3
    finally:
        await engine.shutdown(stop_instances=True)


async def test_too_few_kv_blocks_is_kv_cache_too_small(
    tiny_model, vllm_command, vllm_env, token, tmp_path
):
    events = Events()
    engine = Engine(SystemClock(), tmp_path / "logs", events)
    spec = vllm_spec(
        "kv",
        tiny_model,
        vllm_command,
        # KV sizing fails inside EngineCore with the same message in either process tree; the
        # worker inside it saves a third torch+vLLM import (the pair below keeps the default)
        {**vllm_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        token,
        args={"num-gpu-blocks-override": 4, "max-model-len": 512},
        restart=RestartPolicy(policy="never"),
    )
    try:
        await engine.apply([spec])
        assert await engine.wait("kv", ("failed",), timeout=240) == "failed"
        await engine.settle("kv", timeout=60)
        inst = engine.instances["kv"]
        assert inst.last_exit.reason == "kv_cache_too_small"
        assert inst.last_exit.log_excerpt is not None
        assert "To serve at least one request with the model's max seq len (512)" in (
            inst.last_exit.log_excerpt
        )
        pgid = events.of("spawn", "kv")[0]["pgid"]
        assert group_members(pgid) == []
    finally:
        await engine.shutdown(stop_instances=True)


async def test_port_held_by_a_test_socket_is_port_in_use_without_spawning(
    tiny_model, vllm_command, vllm_env, token, tmp_path
):
    events = Events()
    engine = Engine(SystemClock(), tmp_path / "logs", events)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        spec = vllm_spec(
            "p", tiny_model, vllm_command, vllm_env, token, port=holder.getsockname()[1]
        )
        try:
            await engine.apply([spec])
            assert await engine.wait("p", ("failed",), timeout=30) == "failed"
            await engine.settle("p", timeout=30)
        finally:
            await engine.shutdown(stop_instances=True)
    inst = engine.instances["p"]
    assert inst.last_exit.reason == "port_in_use" and inst.run == 0
    assert events.of("spawn") == [] and len(events.of("exit")) == 1
    assert not Path(tmp_path / "logs" / "p").exists() or not any(
        (tmp_path / "logs" / "p").iterdir()
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(tiny_model, vllm_command, vllm_env, module_token, tmp_path_factory):
    """Two CPU instances (co-tenants of the device `cpu`), applied together."""
    events = Events()
    engine = Engine(
        SystemClock(),
        tmp_path_factory.mktemp("logs"),
        events,
        settings=EngineSettings(chores_interval_s=1.0),
    )
    specs = [vllm_spec(n, tiny_model, vllm_command, vllm_env, module_token) for n in ("v1", "v2")]
    try:
        await engine.apply(specs, wait=True)
        yield engine, events
    finally:
        await engine.shutdown(stop_instances=True)


async def complete(inst) -> str:
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        resp = await client.post(
            f"{inst.spec.base_url}/v1/completions",
            json={"model": inst.spec.model, "prompt": "the supervisor", "max_tokens": 5},
        )
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def title(pid: int) -> str:
    """A process's command line as it shows it (vLLM retitles its own: `VLLM::EngineCore`);
    empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


async def engine_core_pids(inst, timeout=30.0) -> tuple[list[int], list[int]]:
    """(every tracked descendant of the API server, the EngineCore ones among them)."""
    deadline = time.monotonic() + timeout
    while True:
        cores = []
        for pid in inst.descendants:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"VLLM::EngineCore"):
                        cores.append(pid)
            except OSError:
                pass
        if cores:
            return sorted(inst.descendants), cores
        assert time.monotonic() < deadline, "EngineCore never showed up in the tracked tree"
        await asyncio.sleep(0.2)


@MODULE
async def test_two_co_tenants_start_one_after_the_other_and_serve(pair):
    engine, events = pair
    assert {i.state for i in engine.instances.values()} == {"ready"}
    t = {(e["kind"], e.get("instance")): ts for ts, e in events.items}
    assert t["spawn", "v2"] > t["ready", "v1"], (
        "the second co-tenant spawned before the first was ready"
    )
    for inst in engine.instances.values():
        assert isinstance(await complete(inst), str)
        assert os.getpgid(inst.pid) == inst.pid
    print(
        f"v1 ready {events.of('ready', 'v1')[0]['startup_s']} s after spawn; v2 spawned "
        f"{t['spawn', 'v2'] - t['ready', 'v1']:.3f} s after v1 was ready"
    )


@MODULE
async def test_sigkill_of_an_api_server_leaves_none_of_its_group_and_it_comes_back(pair):
    engine, events = pair
    inst = engine.instances["v1"]
    server = inst.pid
    tree, _ = await engine_core_pids(inst)
    # vLLM's own processes (VLLM::EngineCore, VLLM::Worker): the tracked tree may also hold a
    # short-lived helper that ends by itself before the sweep (seen in the suite: a fourth pid
    # gone by then), which no sweep can name
    vllm_own = [p for p in tree if title(p).startswith("VLLM::")]
    assert vllm_own, tree
    t0 = time.monotonic()
    os.kill(server, signal.SIGKILL)
    (exit_,) = await events.wait(
        lambda e: e["kind"] == "exit" and e["instance"] == "v1", timeout=30
    )
    seen = events.stamped("exit", "v1")[0][0] - t0
    assert (exit_["reason"], exit_["signal"], exit_["pid"]) == ("killed", "SIGKILL", server)
    # vLLM left EngineCore and its worker alive (VLLM-FACTS): the sweep ended them
    (sweep,) = await events.wait(
        lambda e: e["kind"] == "sweep" and e["instance"] == "v1", timeout=60
    )
    assert set(vllm_own) <= set(sweep["pids"])
    assert group_members(server) == [] and not any(pid_alive(p) for p in tree)
    await events.wait(
        lambda e: e["kind"] == "ready" and e["instance"] == "v1", count=2, timeout=300
    )
    assert inst.state == "ready" and inst.pid != server and inst.restarts == 1
    assert inst.last_exit.reason == "killed"
    assert isinstance(await complete(inst), str)
    print(f"SIGKILL -> exit event {seen * 1000:.1f} ms; orphans swept: {sweep['pids']}")


@MODULE
async def test_operator_stop_ends_the_whole_group_with_sigterm(pair):
    engine, events = pair
    inst = engine.instances["v1"]
    server = inst.pid
    tree, _ = await engine_core_pids(inst)
    await engine.stop("v1")
    stop_ev = events.of("stop", "v1")[-1]
    assert stop_ev["term"] and not stop_ev["kill"]
    assert inst.state == "stopped" and inst.last_exit.reason == "stopped"
    assert group_members(server) == [] and not any(pid_alive(p) for p in tree)
    print(f"stop of a ready vLLM took {stop_ev['waited_s']} s")


@MODULE
async def test_engine_death_is_classified_engine_dead_and_restarted(pair):
    engine, events = pair
    inst = engine.instances["v2"]
    server = inst.pid
    _, cores = await engine_core_pids(inst)
    os.kill(cores[0], signal.SIGKILL)
    (exit_,) = await events.wait(
        lambda e: e["kind"] == "exit" and e["instance"] == "v2", timeout=60
    )
    assert exit_["reason"] == "engine_dead"
    assert "EngineDeadError" in exit_["log_excerpt"] or "EngineCore" in exit_["log_excerpt"]
    unhealthy = events.of("unhealthy", "v2")
    assert not unhealthy or unhealthy[0]["status"] == 503
    # restarted by its policy: a second spawn, of a new process. That a restarted vLLM becomes
    # ready and serves again is the SIGKILL test's; waiting for it here cost a whole start.
    spawns = await events.wait(
        lambda e: e["kind"] == "spawn" and e["instance"] == "v2", count=2, timeout=120
    )
    spawn = spawns[-1]
    assert spawn["run"] == 2 and spawn["pid"] != server and inst.pid == spawn["pid"]
    assert inst.restarts == 1 and group_members(server) == []
