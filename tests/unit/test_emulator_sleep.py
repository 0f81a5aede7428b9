"""The vLLM emulator's sleep mode (tests/programs/vllm_emulator.py) answers like vLLM's dev-mode
routes (vllm/entrypoints/serve/dev/sleep and rpc) and holds a completion while asleep, as a real
server does (issue 27); its fake HBM is released on sleep and read back through the real
NvmlProbe and Monitor (tests/unit/control/fakehbm.py) as the instance's memory.

Real emulator processes on loopback; each test well under a second of their time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from vsup.control.monitor import Monitor, Target
from vsup.telemetry.metrics import parse_metrics

from tests.conftest import free_port
from tests.support.clock import FakeClock
from tests.unit.control.fakehbm import FakeHbmGpus, GiB, read_hbm_file

EMULATOR = Path(__file__).parents[1] / "programs" / "vllm_emulator.py"

pytestmark = pytest.mark.timeout(60)


class Emulator:
    """One emulator process on a free loopback port, talked to with httpx."""

    def __init__(self, *args: str, dev_mode: bool = True) -> None:
        self.port = free_port()
        env = dict(os.environ)
        env.pop("VLLM_SERVER_DEV_MODE", None)
        if dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, str(EMULATOR), "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.output = ""
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", trust_env=False)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(httpx.ConnectError):
                self.http.get("/health")
                break
            assert self.proc.poll() is None, self.proc.stdout.read()
            assert time.monotonic() < deadline, f"port {self.port} never answered"
            time.sleep(0.02)

    def post(self, path: str, **kw) -> httpx.Response:
        return self.http.post(path, timeout=10, **kw)

    def sleeping(self) -> bool:
        answer = self.http.get("/is_sleeping")
        assert answer.status_code == 200
        return answer.json()["is_sleeping"]

    def sleep_state(self) -> dict[str, float]:
        """`vllm:engine_sleep_state` by its sleep_state label."""
        out = {}
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith("vllm:engine_sleep_state{"):
                label = line.split('sleep_state="', 1)[1].split('"', 1)[0]
                out[label] = float(line.rsplit(" ", 1)[1])
        return out

    def close(self) -> None:
        """End it (once); its log is then in `output`."""
        if self.proc.returncode is not None:
            return
        self.http.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.output = self.proc.stdout.read()
        self.proc.stdout.close()


@pytest.fixture
def emulator():
    started: list[Emulator] = []

    def start(*args: str, dev_mode: bool = True) -> Emulator:
        e = Emulator(*args, dev_mode=dev_mode)
        started.append(e)
        return e

    yield start
    for e in started:
        e.close()


def hbm(path: Path) -> int:
    entry = read_hbm_file(path)
    assert entry is not None, f"{path} holds no fake HBM"
    return entry[1]


class HeldCompletion:
    """A POST /v1/completions sent from a thread (it is held while the server sleeps)."""

    def __init__(self, e: Emulator) -> None:
        self.answer: httpx.Response | None = None
        self.thread = threading.Thread(target=self._send, args=(e.port,), daemon=True)
        self.thread.start()

    def _send(self, port: int) -> None:
        with httpx.Client(trust_env=False) as c:
            self.answer = c.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"model": "emulated-model", "prompt": "hi", "max_tokens": 1},
                timeout=20,
            )

    def join(self, timeout: float) -> httpx.Response | None:
        self.thread.join(timeout)
        return self.answer


def until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def test_without_dev_mode_the_sleep_routes_are_not_there(emulator):
    e = emulator("--enable-sleep-mode", dev_mode=False)
    assert e.post("/sleep", params={"level": 1}).status_code == 404
    assert e.post("/wake_up").status_code == 404
    assert e.http.get("/is_sleeping").status_code == 404
    assert e.post("/collective_rpc", json={"method": "reload_weights"}).status_code == 404
    assert e.post("/v1/completions", json={"prompt": "x"}).status_code == 200


def test_a_level_1_sleep_holds_requests_frees_memory_and_a_wake_answers_them(emulator, tmp_path):
    f = tmp_path / "a.json"
    e = emulator(
        "--enable-sleep-mode",
        "--enable-server-load-tracking",
        "--fake-hbm-file",
        str(f),
        "--fake-hbm-gib",
        "64.6",
    )
    full = hbm(f)
    assert full == int(64.6 * GiB)
    assert json.loads(f.read_text())["pid"] == e.proc.pid
    assert not e.sleeping()
    assert e.sleep_state() == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}

    slept = e.post("/sleep", params={"level": 1})
    assert (slept.status_code, slept.content) == (200, b"")
    assert e.sleeping()
    # what an H200 sleeper kept: ~2.6% (1.7 of 64.6 GiB)
    assert hbm(f) == int(64.6 * 0.026 * GiB)
    assert e.sleep_state() == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
    figures = parse_metrics(e.http.get("/metrics").text)
    assert figures.per_engine["0"].sleeping is True
    assert figures.per_engine["0"].requests_running == 0
    assert figures.per_engine["0"].requests_waiting == 0
    tokens = figures.per_engine["0"].generation_tokens_total

    held = HeldCompletion(e)
    until(lambda: e.http.get("/load").json()["server_load"] == 1)
    assert held.join(0.5) is None, "a sleeping server must not answer a completion"
    assert e.http.get("/health").status_code == 200
    time.sleep(1.1)
    again = parse_metrics(e.http.get("/metrics").text).per_engine["0"]
    assert again.generation_tokens_total == tokens, "a sleeping engine generates nothing"

    woke = e.post("/wake_up")
    assert (woke.status_code, woke.content) == (200, b"")
    answer = held.join(5)
    assert answer is not None and answer.status_code == 200
    assert answer.json()["choices"][0]["text"] == "ok"
    assert not e.sleeping()
    assert hbm(f) == full
    assert e.http.get("/load").json()["server_load"] == 0
    assert e.sleep_state()["awake"] == 1.0


def test_a_level_2_wake_gets_its_weights_back_only_after_reload_weights(emulator, tmp_path):
    f = tmp_path / "b.json"
    e = emulator(
        "--enable-sleep-mode",
        *("--fake-hbm-file", str(f), "--fake-hbm-gib", "40", "--sleep-keep-gib", "2"),
    )
    assert e.post("/sleep?level=2").status_code == 200
    assert e.sleep_state() == {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}
    assert hbm(f) == 2 * GiB

    assert e.post("/wake_up", params={"tags": "weights"}).status_code == 200
    assert e.sleeping(), "asleep until every tag is awake"
    assert hbm(f) == 2 * GiB, "level 2 dropped the weights: nothing to bring back yet"
    rpc = e.post("/collective_rpc", json={"method": "reload_weights"})
    assert (rpc.status_code, rpc.json()) == (200, {"results": [None]})
    assert hbm(f) == 21 * GiB  # the remainder plus the weights' half of the rest
    held = HeldCompletion(e)
    assert held.join(0.3) is None
    assert e.post("/wake_up?tags=kv_cache").status_code == 200
    assert not e.sleeping()
    assert hbm(f) == 40 * GiB
    answer = held.join(5)
    assert answer is not None and answer.status_code == 200

    missing = e.post("/collective_rpc", json={"args": []})
    assert (missing.status_code, missing.json()) == (
        400,
        {"detail": "Missing 'method' in request body"},
    )
    assert e.post("/collective_rpc", json={"method": "no_such_method"}).status_code == 500


def test_a_sleep_while_asleep_and_a_wake_while_awake_change_nothing(emulator):
    e = emulator("--enable-sleep-mode")
    assert e.post("/wake_up").status_code == 200
    assert not e.sleeping()
    assert e.post("/sleep?level=1").status_code == 200
    assert e.post("/sleep?level=2").status_code == 200
    assert e.sleep_state()["weights_offloaded"] == 1.0, "the first sleep's level stands"
    e.close()
    assert "Executor is not sleeping." in e.output, "vLLM's warnings, in its log"
    assert "Executor is already sleeping." in e.output


def test_faults_on_cue(emulator, tmp_path):
    f = tmp_path / "c.json"
    e = emulator(
        "--enable-sleep-mode",
        *("--wake-fail", "1", "--sleep-s", "0.4", "--wake-s", "0.2"),
        *("--fake-hbm-file", str(f), "--fake-hbm-gib", "10"),
    )
    t0 = time.monotonic()
    assert e.post("/sleep?level=1").status_code == 200
    assert time.monotonic() - t0 >= 0.4, "--sleep-s: the sleep answers once it is done"
    failed = e.post("/wake_up")
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["code"] == 500 and "CUDA out of memory" in error["message"]
    assert e.sleeping(), "a failed wake leaves it asleep"
    assert hbm(f) == int(10 * 0.026 * GiB)
    t0 = time.monotonic()
    assert e.post("/wake_up").status_code == 200
    assert time.monotonic() - t0 >= 0.2
    assert not e.sleeping() and hbm(f) == 10 * GiB

    keeps = tmp_path / "d.json"
    k = emulator(
        "--enable-sleep-mode",
        "--sleep-keeps-memory",
        *("--fake-hbm-file", str(keeps), "--fake-hbm-gib", "10"),
    )
    assert k.post("/sleep?level=1").status_code == 200
    assert k.sleeping()
    assert hbm(keeps) == 10 * GiB, "the ROCm fault: asleep, memory still held"

    off = emulator()  # dev mode without --enable-sleep-mode
    assert off.post("/sleep").status_code == 500
    assert not off.sleeping()


def test_a_client_that_gives_up_on_a_sleeper_leaves_its_load(emulator):
    e = emulator("--enable-sleep-mode", "--enable-server-load-tracking")
    assert e.post("/sleep").status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        e.http.post("/v1/completions", json={"prompt": "x"}, timeout=0.3)
    until(lambda: e.http.get("/load").json()["server_load"] == 0)
    assert e.post("/wake_up").status_code == 200
    assert e.post("/v1/completions", json={"prompt": "x"}).status_code == 200


async def test_the_fake_hbm_is_the_instances_memory_to_nvml_and_the_monitor(emulator, tmp_path):
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    a = emulator("--enable-sleep-mode", *gpus.cli_args(1, "a", 64.6))
    b = emulator("--enable-sleep-mode", *gpus.cli_args(1, "b", 20.0, keep_gib=1.0))
    probe = gpus.probe()
    monitor = Monitor(FakeClock(), probe=probe)
    try:
        targets = [
            Target(n, f"http://127.0.0.1:{e.port}", 1, e.proc.pid, e.proc.pid, (1,), True, None)
            for n, e in (("a", a), ("b", b))
        ]
        g0, g1 = probe.snapshot()
        assert g0.processes == () and g0.hbm_used_bytes == 600 * 2**20
        assert {p.pid: p.hbm_bytes for p in g1.processes} == {
            a.proc.pid: int(64.6 * GiB),
            b.proc.pid: 20 * GiB,
        }
        assert g1.hbm_used_bytes == 600 * 2**20 + int(64.6 * GiB) + 20 * GiB
        await monitor.poll(targets)
        assert monitor.fields("a", True)["hbm_bytes"] == int(64.6 * GiB)
        assert monitor.fields("b", True)["hbm_bytes"] == 20 * GiB

        assert b.post("/sleep?level=1").status_code == 200
        await monitor.poll(targets)
        assert monitor.fields("b", True)["hbm_bytes"] == 1 * GiB, "the sleep is seen released"
        memory = monitor.gpu_memory((1,))
        assert memory is not None
        (free,) = memory
        assert free.used_bytes == 600 * 2**20 + int(64.6 * GiB) + 1 * GiB

        a.close()  # a dead process holds nothing: its file is left, its pid gone
        (_, g1) = probe.snapshot()
        assert [p.pid for p in g1.processes] == [b.proc.pid]
    finally:
        await monitor.close()
