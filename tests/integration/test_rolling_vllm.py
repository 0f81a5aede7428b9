"""A rolling apply with real vLLM servers (CPU build), through the real CLI, under load.

Two replicas of the tiny model run with `[layout] max_unavailable = 1`; a change to
`[defaults] args` is applied with `vsup up --yes --wait` while a client thread sends completion
requests to both replicas at once, round after round, the whole time (two, not more: CI has two
cores, and each restarting vLLM needs them while the others serve). It asserts:
- every round during the apply gets at least N - max_unavailable = 1 answer of the 2 (never
  both replicas down at once), over more than 20 rounds;
- the client saw the restarts, one replica after another (r0 down, then r1), and both answer
  in the last round;
- the CLI reported both waves in layout order and the rollout done (2/2);
- afterwards both replicas are ready with new pids, status's rollout is done, and the journal
  has a drain for r0 then r1.

Bounded: requests go to 127.0.0.1 only, one per replica per round, at most MAX_ROUNDS rounds,
each with a timeout.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import free_port, run_vsup

# A vLLM start takes 30 s on an idle 2-core machine and 4 min on a loaded one: generous limits.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3000)]
# the CPU build's worker inside its EngineCore, as on a GPU at TP1 (tests/conftest.py, vllm_env):
# this module tests vsup over vLLM's HTTP API, and a start costs about half as long that way
VLLM_ONE_PROCESS = True

N = 2
MAX_UNAVAILABLE = 1
MAX_ROUNDS = 4000
REQUEST_TIMEOUT_S = 20.0


vsup = partial(run_vsup, timeout=1500)


def layout_text(model: Path, ports: list[int], vllm_env: dict, max_model_len: int) -> str:
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    text = f"""
[layout]
name = "cpu-rolling"
max_unavailable = {MAX_UNAVAILABLE}
drain_timeout_s = 10

[defaults]
model = "{model}"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = {max_model_len} }}
env = {{ {env} }}
start_timeout_s = 900
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 3 }}
"""
    for i, port in enumerate(ports):
        # vLLM CPU binds every instance's OpenMP threads to core 0 ("auto"), where a serving
        # replica's spinning worker starves a restarting one for minutes: one core each.
        bind = i % max(1, os.cpu_count() or 1)
        text += (
            f'\n[[instance]]\nname = "r{i}"\ngpus = []\nport = {port}\n'
            f'env = {{ VLLM_CPU_OMP_THREADS_BIND = "{bind}" }}\n'
        )
    return text


def ask(port: int, model: str) -> bool:
    """One short completion on a fresh connection; True when it answered 200."""
    body = json.dumps({"model": model, "prompt": "the quick brown fox", "max_tokens": 4})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class Client(threading.Thread):
    """Sends one request to every replica at once per round until stopped."""

    def __init__(self, ports: list[int], model: str) -> None:
        super().__init__(daemon=True)
        self.ports, self.model = ports, model
        self.rounds: list[tuple[float, tuple[bool, ...]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with ThreadPoolExecutor(len(self.ports)) as pool:
            while not self.stop.is_set() and len(self.rounds) < MAX_ROUNDS:
                t = time.monotonic()
                oks = tuple(pool.map(lambda p: ask(p, self.model), self.ports))
                self.rounds.append((t, oks))
                # a round every half second: steady load that still leaves the 2 cores of CI
                # to the restarting replica (back-to-back rounds stretched each start to minutes)
                self.stop.wait(0.5)


def test_rolling_apply_keeps_n_minus_max_unavailable_serving(
    vsup_home, tiny_model, vllm_env, tmp_path
):
    home = vsup_home
    ports = [free_port() for _ in range(N)]
    first, changed = tmp_path / "v1.toml", tmp_path / "v2.toml"
    first.write_text(layout_text(tiny_model, ports, vllm_env, 512))
    changed.write_text(layout_text(tiny_model, ports, vllm_env, 384))
    client = Client(ports, str(tiny_model))
    try:
        up = vsup(home, "up", str(first), "--detach", "--wait", "--timeout", "1200")
        assert up.returncode == 0, up.stdout + up.stderr
        before = {
            i["name"]: i["pid"]
            for i in json.loads(vsup(home, "status", "--json").stdout)["instances"]
        }
        client.start()
        # the client sees all replicas answer before the change
        deadline = time.monotonic() + 60
        while not any(all(oks) for _, oks in client.rounds):
            assert time.monotonic() < deadline, "the replicas did not answer before the change"
            time.sleep(0.2)
        t_apply = time.monotonic()
        roll = vsup(home, "up", str(changed), "--detach", "--yes", "--wait", "--timeout", "1200")
        time.sleep(1.0)  # a few rounds after the last replica came back
        client.stop.set()
        client.join(REQUEST_TIMEOUT_S * 2)
        assert roll.returncode == 0, roll.stdout + roll.stderr
        out = roll.stdout
        names = [f"r{i}" for i in range(N)]
        assert f"restart (changed, rolling): {', '.join(names)}" in out
        for wave, name in enumerate(names, start=1):
            assert f"rollout wave {wave}/{N}: restarting {name}" in out
        assert f"rollout done ({N}/{N} restarted)" in out

        during = [(t, oks) for t, oks in client.rounds if t >= t_apply]
        assert len(during) > 20, "too few rounds to judge"
        answered = [sum(oks) for _, oks in during]
        worst = min(answered)
        print(
            f"\nrolling apply under load: {len(during)} rounds of {N} requests, "
            f"{sum(1 for a in answered if a < N)} with a replica down, fewest answers {worst}/{N}, "
            f"rollout {time.monotonic() - t_apply:.0f} s"
        )
        assert worst >= N - MAX_UNAVAILABLE, (
            f"a round got only {worst} answers of {N}: "
            f"{[(round(t - t_apply, 1), oks) for t, oks in during if sum(oks) < N - 1]}"
        )
        # the restarts really happened under the client's eyes, one replica after another
        down_order = []
        for _, oks in during:
            for i, ok in enumerate(oks):
                if not ok and (not down_order or down_order[-1] != i):
                    down_order.append(i)
        assert down_order == list(range(N)), down_order
        assert all(during[-1][1]), "every replica answers after the rollout"

        doc = json.loads(vsup(home, "status", "--json").stdout)
        assert doc["rollout"]["state"] == "done" and doc["rollout"]["done"] == N
        after = {i["name"]: i for i in doc["instances"]}
        assert all(after[n]["state"] == "ready" and after[n]["pid"] != before[n] for n in before)
        events = [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines()]
        drains = [e for e in events if e.get("kind") == "drain"]
        assert [e["instance"] for e in drains] == names
    finally:
        client.stop.set()
        vsup(home, "down", timeout=120)  # without a terminal `down` proceeds
        journal = home / "journal.jsonl"
        if journal.exists():
            for line in journal.read_text().splitlines():
                ev = json.loads(line)
                if ev.get("kind") == "spawn":
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(ev["pgid"], signal.SIGKILL)
