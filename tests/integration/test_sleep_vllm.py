"""vLLM's sleep mode, end to end on real CPU vLLM servers behind the real vllm-router
(docs/sleep.md): a swap group of two (a awake, b asleep) and one instance outside it. b serves
its model under another name (`mb`), so the router fronts two models (its gateway mode) and
the last tests drive wake on request (docs/sleep.md, "Wake on request"): a request for `mb`
while b sleeps is held and b woken for it.

The CPU build answers the sleep endpoints and pauses its scheduler while asleep (a request sent
to a sleeper is held, as on a GPU) but frees no memory (`sleep mode is not supported on CPU`):
these tests prove the protocol and the bookkeeping - the start order, the router's membership,
swap, wake, the journal, a daemon restart while one sleeps - and the H200 proves the memory
(docs/gpu-runs). One daemon and one set of servers for the module, the tests in file order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import daemon_status, free_port, outside_cwd, until
from tests.programs.router_fleet import completion_body, router_command, steady_load

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
# the CPU build's worker inside its EngineCore, as on a GPU at TP1 (tests/conftest.py, vllm_env):
# this module tests vsup over vLLM's HTTP API, and a start costs about half as long that way
VLLM_ONE_PROCESS = True

NAMES = ("a", "b", "c")  # a and b time-share (swap group g0); c serves beside them
MB = "mb"  # b's served name: a and c serve the model under its path
HOLD_S = 60  # the layout's [router] hold_s (the hold_s test sets a short one)


@dataclass
class Node:
    home: Path
    model: str
    ports: dict[str, int]
    router_port: int
    vllm_env: dict = field(default_factory=dict)

    def apply(self, hold_s: float) -> None:
        """Apply the module's layout with another hold_s (the router keeps running)."""
        layout = self.home / "sleep.toml"
        layout.write_text(layout_text(self, self.vllm_env, hold_s))
        out = self.vsup("up", str(layout), "--yes", timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr

    def vsup(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "vsup", *args],
            env=dict(os.environ, VSUP_HOME=str(self.home)),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=outside_cwd(),
            stdin=subprocess.DEVNULL,
        )

    def status(self) -> dict:
        doc = daemon_status(self.home)  # in this process: `vsup status`'s table is read below
        # what `vsup status`'s exit status 0 said: every instance is ready
        assert all(i["state"] == "ready" for i in doc["instances"]), doc["instances"]
        return doc

    def inst(self, name: str) -> dict:
        return next(i for i in self.status()["instances"] if i["name"] == name)

    def events(self, kind: str) -> list[dict]:
        lines = (self.home / "journal.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("kind") == kind]

    def in_router(self) -> set[str]:
        router = self.status().get("router") or {}
        return {w["name"] for w in router.get("workers", ()) if w.get("in_router")}

    def holder(self, model: str) -> dict:
        # any instance's state: b is stopped in the last test
        router = daemon_status(self.home)["router"]
        return next(h for h in router["holders"] if h["model"] == model)

    def ask(self, model: str, timeout: float = 120, **kw) -> httpx.Response:
        return httpx.post(
            f"http://127.0.0.1:{self.router_port}/v1/completions",
            json=completion_body(model, 2),
            timeout=timeout,
            **kw,
        )

    def is_sleeping(self, name: str) -> bool:
        url = f"http://127.0.0.1:{self.ports[name]}/is_sleeping"
        return httpx.get(url, timeout=10).json()["is_sleeping"]


def layout_text(node: Node, vllm_env: dict, hold_s: float = HOLD_S) -> str:
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    text = f"""
[layout]
name = "cpu-sleep"

[defaults]
model = "{node.model}"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {{ {env} }}
start_timeout_s = 900
drain_timeout_s = 30
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, max_failures = 3 }}

[router]
port = {node.router_port}
host = "127.0.0.1"
policy = "round_robin"
command = {json.dumps(router_command())}
hold_s = {hold_s}
"""
    for name in NAMES:
        text += f'\n[[instance]]\nname = "{name}"\ngpus = []\nport = {node.ports[name]}\n'
        if name != "c":
            text += 'swap_group = "g0"\nsleep = { level = 1 }\n'
        if name == "b":
            text += f'args = {{ served-model-name = "{MB}" }}\n'
    return text


@pytest.fixture(scope="module")
def node(tiny_model: Path, vllm_env: dict) -> Iterator[Node]:
    home = Path(tempfile.mkdtemp(prefix="vsup-sl-", dir="/tmp"))
    node = Node(
        home=home,
        model=str(tiny_model),
        ports={n: free_port() for n in NAMES},
        router_port=free_port(),
        vllm_env=vllm_env,
    )
    layout = home / "sleep.toml"
    layout.write_text(layout_text(node, vllm_env))
    try:
        up = node.vsup("up", str(layout), "--detach", "--wait", "--yes", "--timeout", "1500",
                       timeout=1600)  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        yield node
    finally:
        node.vsup("down", "--yes", timeout=300)
        for proc in psutil.process_iter(["environ"]):
            try:
                if (proc.info["environ"] or {}).get("VSUP_HOME") == str(home):
                    proc.kill()
            except psutil.Error:
                pass
        shutil.rmtree(home, ignore_errors=True)


def test_up_starts_the_group_one_awake_and_the_router_sends_to_awake_ones_only(node):
    a, b = node.inst("a"), node.inst("b")
    assert a["state"] == "ready" and b["state"] == "ready", (a, b)
    assert a["sleep"]["state"] == "awake" and a["sleep"]["group"] == "g0", a["sleep"]
    assert b["sleep"]["state"] == "asleep" and b["sleep"]["level"] == 1, b["sleep"]
    assert node.inst("c")["sleep"] is None
    assert node.is_sleeping("b") and not node.is_sleeping("a")
    until(lambda: node.in_router() == {"a", "c"}, 60, "a and c in the router, b out")
    # b was started first and put to sleep before a's start (the group's start order)
    sleeps = node.events("sleep")
    assert [(e["instance"], e["why"]) for e in sleeps] == [("b", "started asleep")], sleeps
    spawns = [e["instance"] for e in node.events("spawn") if e.get("instance") in ("a", "b")]
    assert spawns == ["b", "a"], spawns
    text = node.vsup("status").stdout
    assert "asleep" in text, text


def test_swap_loses_no_request_of_what_stays_awake(node):
    stop = asyncio.Event()

    async def load_during_swap():
        task = asyncio.create_task(
            steady_load(
                f"http://127.0.0.1:{node.router_port}",
                node.model,
                600,
                2,
                max_tokens=2,
                rate_per_s=4,
                stop=stop,
            )  # fmt: skip
        )
        await asyncio.sleep(3)
        swap = await asyncio.to_thread(node.vsup, "swap", "a", "b")
        await asyncio.sleep(3)
        stop.set()
        return swap, await task

    swap, load = asyncio.run(load_during_swap())
    assert swap.returncode == 0, swap.stdout + swap.stderr
    assert "a: asleep (level 1)" in swap.stdout and "b: awake in" in swap.stdout, swap.stdout
    assert load.errors == [], load.errors[:5]
    assert load.ok >= 10, load.ok
    assert node.is_sleeping("a") and not node.is_sleeping("b")
    a, b = node.inst("a"), node.inst("b")
    assert a["sleep"]["state"] == "asleep" and b["sleep"]["state"] == "awake"
    assert b["sleep"]["last_wake_s"] is not None and a["sleep"]["last_sleep_s"] is not None
    until(lambda: node.in_router() == {"b", "c"}, 60, "b and c in the router, a out")
    swaps = node.events("swap")
    assert len(swaps) == 1 and swaps[0]["instance"] == "b" and swaps[0]["slept"] == "a"
    wakes = node.events("wake")
    assert wakes[-1]["instance"] == "b" and wakes[-1]["took_s"] > 0, wakes


def test_refusals_name_the_instance_and_say_why(node):
    out = node.vsup("sleep", "c")
    assert out.returncode == 1 and "c does not use sleep mode" in out.stderr, out.stderr
    out = node.vsup("sleep", "nosuch")
    assert out.returncode != 0 and "nosuch" in out.stderr, out.stderr
    out = node.vsup("sleep", "a")  # already asleep
    assert out.returncode == 0 and "a: already asleep" in out.stdout, out.stdout


def test_a_daemon_restart_keeps_the_sleeper_asleep_and_out_of_the_router(node):
    pid = node.status()["supervisor"]["pid"]
    os.kill(pid, signal.SIGTERM)  # the daemon ends; its instances go on
    until(lambda: not psutil.pid_exists(pid), 60, "the daemon gone")
    assert node.vsup("daemon", "--detach").returncode == 0

    def inst(name: str) -> dict:  # not node.inst: an adopted instance may still be starting
        return next(i for i in daemon_status(node.home)["instances"] if i["name"] == name)

    # the new daemon knows a's sleep state once the server has answered it ("unknown" until)
    a = until(
        lambda: (i := inst("a"))["sleep"] and i["sleep"]["state"] != "unknown" and i,
        60,
        "a's sleep state back",
    )
    assert a["sleep"]["state"] == "asleep", a["sleep"]
    until(lambda: (inst("b")["sleep"] or {}).get("state") == "awake", 60, "b's sleep state back")
    until(lambda: node.in_router() == {"b", "c"}, 60, "the router's members kept")


def test_wake_puts_the_awake_member_to_sleep_first(node):
    out = node.vsup("wake", "a")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a: awake in" in out.stdout, out.stdout
    assert node.is_sleeping("b") and not node.is_sleeping("a")
    wake = node.events("wake")[-1]
    slept = node.events("sleep")[-1]
    assert wake["instance"] == "a" and slept["instance"] == "b", (wake, slept)
    assert slept["why"] == "a wakes in swap group g0", slept
    until(lambda: node.in_router() == {"a", "c"}, 60, "a back in the router")
    answer = httpx.post(
        f"http://127.0.0.1:{node.router_port}/v1/completions",
        json=completion_body(node.model, 2),
        timeout=60,
    )
    assert answer.status_code == 200, answer.text


def engine_core(api_pid: int) -> psutil.Process:
    for p in psutil.Process(api_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "VLLM::EngineCore":
                return p
    raise AssertionError(f"no VLLM::EngineCore under pid {api_pid}")


def sleeps_in_flight(node: Node, name: str) -> float:
    """vLLM's own count of /sleep calls it is serving (`vllm:sleep_mode_operations_in_flight`)."""
    text = httpx.get(f"http://127.0.0.1:{node.ports[name]}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("vllm:sleep_mode_operations_in_flight{") and 'operation="sleep"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_daemon_killed_mid_sleep_leaves_a_new_one_that_tells_the_sleep_and_wakes_it(node):
    """Issue 35 item 4: the daemon is SIGKILLed while vLLM is still doing its /sleep (its
    EngineCore is frozen, as a GPU's first level-1 sleep keeps it busy for 9-14 s, so the sleep
    and /is_sleeping wait in its queue). The next daemon must never show the instance awake
    while the server has not said so, keep it out of the router, show it asleep once the
    server sleeps, and `vsup wake` must wake it."""
    a = node.inst("a")
    assert a["sleep"]["state"] == "awake" and node.is_sleeping("b"), (a, node.inst("b"))
    core = engine_core(a["pid"])
    old = node.status()["supervisor"]["pid"]
    core.suspend()
    sleeper = None
    try:
        sleeper = subprocess.Popen(
            [sys.executable, "-m", "vsup", "sleep", "a"],
            env=dict(os.environ, VSUP_HOME=str(node.home)),
            cwd=outside_cwd(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        # vLLM has the daemon's /sleep in hand (the frozen engine holds it): kill the daemon
        until(lambda: sleeps_in_flight(node, "a") >= 1, 120, "vLLM serving a's /sleep")
        os.kill(old, signal.SIGKILL)
        until(lambda: not psutil.pid_exists(old), 60, "the daemon gone")
        sleeper.communicate(timeout=60)
        t0 = time.monotonic()
        assert node.vsup("daemon", "--detach").returncode == 0
        first = node.inst("a")
        print(f"first status {time.monotonic() - t0:.2f} s after the new daemon's start: "
              f"{first['sleep']}")  # fmt: skip
        # the server has not said (its engine is busy with the sleep): anything but awake
        assert first["sleep"]["state"] != "awake", first["sleep"]
        assert "a" not in node.in_router()
    finally:
        core.resume()
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
    t1 = time.monotonic()
    asleep = until(
        lambda: (s := node.inst("a")["sleep"])["state"] == "asleep" and s, 120, "a seen asleep"
    )
    print(f"asleep in the new daemon's status {time.monotonic() - t1:.2f} s after the engine "
          f"went on: {asleep}")  # fmt: skip
    assert node.is_sleeping("a")
    assert "a" not in node.in_router()
    out = node.vsup("wake", "a")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a: awake in" in out.stdout, out.stdout
    assert not node.is_sleeping("a") and node.is_sleeping("b")
    until(lambda: node.in_router() == {"a", "c"}, 60, "a back in the router")
    answer = httpx.post(
        f"http://127.0.0.1:{node.router_port}/v1/completions",
        json=completion_body(node.model, 2),
        timeout=60,
    )
    assert answer.status_code == 200, answer.text


def test_a_daemon_killed_after_a_sleep_leaves_a_new_one_that_shows_it_asleep_at_once(node):
    """The first status of a daemon started after one was SIGKILLed says asleep for the
    instance its server says sleeps (the adoption asks the server before it answers)."""
    assert node.vsup("sleep", "a").returncode == 0
    assert node.is_sleeping("a")
    old = node.status()["supervisor"]["pid"]
    os.kill(old, signal.SIGKILL)
    until(lambda: not psutil.pid_exists(old), 60, "the daemon gone")
    t0 = time.monotonic()
    assert node.vsup("daemon", "--detach").returncode == 0
    first = node.inst("a")
    print(f"first status {time.monotonic() - t0:.2f} s after the new daemon's start: "
          f"{first['sleep']}")  # fmt: skip
    assert first["sleep"]["state"] == "asleep", first["sleep"]
    out = node.vsup("wake", "a")
    assert out.returncode == 0 and "a: awake in" in out.stdout, out.stdout + out.stderr
    assert not node.is_sleeping("a")


# -- wake on request: one endpoint, two models (docs/sleep.md, "Wake on request") ---------------


def test_one_endpoint_lists_both_models_and_answers_an_unknown_one_as_vllm_does(node):
    """The router fronts a/c (the model's path) and b (`mb`) in its gateway mode: /v1/models
    names both, awake or asleep (b sleeps: its holder stands in), and a model nobody serves
    gets vLLM's own 404."""
    assert node.is_sleeping("b") and not node.is_sleeping("a")
    base = f"http://127.0.0.1:{node.router_port}"
    until(lambda: node.holder(MB)["in_router"], 60, "mb's holder in the router while b sleeps")
    models = httpx.get(f"{base}/v1/models", timeout=30).json()
    # vllm-router's gateway mode answers /v1/models itself, in its own shape
    assert sorted(models["models"]) == sorted([node.model, MB]), models
    direct = httpx.post(
        f"http://127.0.0.1:{node.ports['c']}/v1/completions",
        json=completion_body("nosuch-model", 2),
        timeout=60,
    )
    assert direct.status_code == 404, direct.text

    def shape(resp: httpx.Response) -> dict:
        err = resp.json()["error"]
        # "... does not exist. Valid aliases: NAME." names what the worker serves
        return {**err, "message": err["message"].split(" Valid aliases: ")[0]}

    assert shape(direct)["message"] == "The model `nosuch-model` does not exist.", direct.text
    for _ in range(6):  # whichever worker the router picks (vLLM, or a holder)
        routed = node.ask("nosuch-model")
        assert routed.status_code == 404 and shape(routed) == shape(direct), routed.text
        assert set(routed.json()) == {"error"}, routed.text


def test_a_request_for_the_sleeping_model_is_held_and_answered(node):
    answer = node.ask(MB)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == MB
    assert not node.is_sleeping("b") and node.is_sleeping("a")
    woke = node.events("hold_wake")[-1]
    assert woke["model"] == MB and woke["woke"] == "b" and woke["held"] >= 1, woke
    ended = until(lambda: node.events("hold_end"), 60, "the hold's end journaled")[-1]
    assert ended["model"] == MB and ended["forwarded"] >= 1 and not ended.get("error"), ended
    wake = node.events("wake")[-1]
    assert wake["instance"] == "b" and "wake on request" in wake["why"], wake
    until(lambda: node.in_router() == {"b", "c"}, 60, "b in the router, its holder out")
    until(lambda: not node.holder(MB)["in_router"], 60, "mb's holder out of the router")
    assert node.holder(MB)["forwarded"] >= 1


def test_fifty_requests_alternating_between_the_models_are_all_answered(node):
    """b asleep again (a woken); then mb, path, mb, ...: the first mb request wakes b, and
    each answer comes from the model it asked for."""
    assert node.vsup("wake", "a").returncode == 0
    assert node.is_sleeping("b")
    bad = []
    for i in range(50):
        model = MB if i % 2 == 0 else node.model
        resp = node.ask(model)
        if resp.status_code != 200 or resp.json()["model"] != model:
            bad.append((i, model, resp.status_code, resp.text[:200]))
    assert bad == [], bad
    assert not node.is_sleeping("b")


def test_requests_for_both_models_during_an_explicit_swap_are_all_answered(node):
    """`vsup swap b a` while clients ask for both models: mb's requests that arrive while b
    falls asleep are held and b is woken again for them (wake on request), the path's go to c
    and a; none fails."""

    async def run():
        stop = asyncio.Event()
        base = f"http://127.0.0.1:{node.router_port}"
        loads = [
            asyncio.create_task(
                steady_load(
                    base,
                    model,
                    600,
                    1,
                    max_tokens=2,
                    rate_per_s=3,
                    stop=stop,
                    timeout_s=HOLD_S + 60,
                )  # fmt: skip
            )
            for model in (MB, node.model)
        ]
        await asyncio.sleep(2)
        swap = await asyncio.to_thread(node.vsup, "swap", "b", "a")
        await asyncio.sleep(2)
        stop.set()
        return swap, await asyncio.gather(*loads)

    swap, (mb, path) = asyncio.run(run())
    assert swap.returncode == 0, swap.stdout + swap.stderr
    assert mb.errors == [] and path.errors == [], (mb.errors[:5], path.errors[:5])
    assert mb.ok >= 3 and path.ok >= 3, (mb.ok, path.ok)
    assert node.holder(MB)["held"] == 0


def test_a_held_request_past_hold_s_is_refused_and_one_whose_client_leaves_is_dropped(node):
    """b asleep with its engine frozen (its wake cannot end): of two requests for mb, the one
    whose client gives up is dropped from the queue, the other is refused (507: vllm-router
    retries a worker's 503) with Retry-After and why once hold_s passes; the wake then ends once the engine goes on."""
    node.apply(hold_s=3)
    try:
        if not node.is_sleeping("b"):
            assert node.vsup("wake", "a").returncode == 0
        assert node.is_sleeping("b")
        until(lambda: node.holder(MB)["in_router"], 60, "mb's holder in the router")
        before = node.holder(MB)
        core = engine_core(node.inst("b")["pid"])
        core.suspend()
        try:
            with pytest.raises(httpx.TimeoutException):
                node.ask(MB, timeout=1)  # the client gives up while held
            late = node.ask(MB)
            held = node.holder(MB)
        finally:
            core.resume()
        assert late.status_code == 507, late.text
        assert int(late.headers["retry-after"]) >= 1
        err = late.json()["error"]
        assert err["vsup"] == "timeout" and "hold_s = 3 s" in err["message"], err
        assert err["code"] == 507 and MB in err["message"], err
        assert held["dropped"] == before["dropped"] + 1, (before, held)
        # the status is the daemon's latest poll: the count follows within a second
        until(
            lambda: node.holder(MB)["timed_out"] == before["timed_out"] + 1, 30, "timed_out counted"
        )
        assert node.holder(MB)["held"] == 0
        # the wake goes on once the engine does: b serves
        until(lambda: not node.is_sleeping("b"), 300, "b awake once its engine goes on")
        assert node.ask(MB).status_code == 200
    finally:
        node.apply(hold_s=HOLD_S)


def test_a_wake_that_fails_ends_the_held_requests_with_its_reason(node):
    """b stopped and its port taken by someone else: a request for mb is held, b's start
    (the wake of a member that is not running) fails at once, and the request is refused
    with that reason rather than after hold_s. Last in the module: b stays failed."""
    assert node.vsup("stop", "b").returncode == 0
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", node.ports["b"]))
        squatter.listen()
        until(lambda: node.holder(MB)["in_router"], 60, "mb's holder in the router")
        resp = node.ask(MB)
    assert resp.status_code == 507, resp.text
    err = resp.json()["error"]
    assert err["vsup"] == "wake_failed" and "could not be woken" in err["message"], err
    assert "b" in err["message"] and "failed" in err["message"], err
    ended = until(
        lambda: [e for e in node.events("hold_end") if e.get("error")], 60, "a failed hold"
    )[-1]
    assert ended["model"] == MB and ended["failed"] == 1, ended


def test_no_holder_of_vsup_was_ever_taken_for_a_foreign_worker(node):
    """Daemons were killed and restarted above: a new daemon's holders listen on other ports,
    and the old ones it finds in the router are its own (the state file says), not someone
    else's: removed without the router_foreign_worker alarm."""
    assert node.events("router_foreign_worker") == []
