"""One vLLM server across two nodes, supervised as one unit (docs/fleet.md, "One server across
nodes"): two "nodes" (two VSUP_HOMEs behind local OpenSSH servers on 127.0.0.1), real CPU vLLM
with data parallel across them, one rank on each.

`vsup fleet up` starts the head on gpu01 and the headless follower on gpu02 through each node's
own daemon; each rank serves a request (vLLM's `X-data-parallel-rank` header); the follower's
vLLM SIGKILLed (the head keeps answering /health 200 while requests to the dead rank hang) ->
the head's probe of rank 1 goes unanswered, the head restarts, its followers restart behind it,
and the unit serves again without a person; `vsup fleet up` of a changed layout restarts both
members on it and the unit serves again; `vsup fleet down` then leaves no vLLM on either node.

Run it under the machine's heavy lock:
    flock /tmp/vsup-real.lock make test TESTS=tests/integration/fleet/test_span_vllm.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

import httpx
import psutil
import pytest

from vsup.control.client import JsonClient

from tests.conftest import until
from tests.integration.fleet.sshnodes import SshFleet, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.multinode, pytest.mark.timeout(1200)]
# the CPU build's worker inside each rank's EngineCore (tests/conftest.py, vllm_env)
VLLM_ONE_PROCESS = True


def unit_layout(tiny_model, vllm_env: dict[str, str], port: int, span: str, args: str = "") -> str:
    """The unit both span tests run: `span` its table, `args` what its kind adds."""
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    command = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    return f"""[layout]
name = "unit"

[[instance]]
name = "big"
model = "{tiny_model}"
command = {command}
host = "127.0.0.1"
gpus = []
port = {port}
pull = false
args = {{ {args}dtype = "float32", enforce-eager = true, max-model-len = 512, served-model-name = "tiny" }}
env = {{ {env} }}
stop_grace_s = 10
stall_after_s = 15
canary_interval_s = 3
restart = {{ policy = "on-failure", backoff_s = 2, backoff_max_s = 10, max_failures = 10 }}
span = {span}
"""


def layout(tiny_model, vllm_env: dict[str, str], port: int, rpc_port: int, args: str = "") -> str:
    span = f'{{ ranks = {{ gpu01 = 1, gpu02 = 1 }}, address = "127.0.0.1", rpc_port = {rpc_port} }}'
    return unit_layout(tiny_model, vllm_env, port, span, args)


def served_by(port: int, rank: int, timeout: float = 20) -> bool:
    """A 1-token completion that rank `rank` answers (vLLM routes it by the header)."""
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            headers={"X-data-parallel-rank": str(rank)},
            json={"model": "tiny", "prompt": "hello", "max_tokens": 1},
            timeout=timeout,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and bool(r.json()["choices"])


def member(f: SshFleet, node: str) -> dict:
    """The node's instance, as `vsup status --json` on the node shows it."""
    res = f.nodes[node].vsup("status", "--json")
    assert res.returncode in (0, 1), res.stderr
    (inst,) = json.loads(res.stdout)["instances"]
    return inst


def polled(f: SshFleet, node: str) -> dict:
    """The same from the node's control API in this process: a `vsup status` subprocess per
    poll costs about 0.4 CPU-s on both nodes' shared cores while the unit restarts."""
    with contextlib.closing(JsonClient(f.nodes[node].home, timeout=60)) as client:
        (inst,) = client.status()["instances"]
        return inst


def vllm_of(home) -> list[psutil.Process]:
    """The processes a node's daemon started (its VSUP_HOME in their environment) that run
    vLLM."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = p.info.get("environ") or {}
            cmd = " ".join(p.info.get("cmdline") or ())
        except psutil.Error:
            continue
        if env.get("VSUP_HOME") == str(home) and ("vllm" in cmd or "VLLM" in cmd):
            out.append(p)
    return out


def runs_flag(home, flag: str, value: str) -> bool:
    """Whether a vLLM process the node's daemon started was given `flag value`."""
    for p in vllm_of(home):
        with contextlib.suppress(psutil.Error):
            cmd = p.cmdline()
            if any(a == flag and b == value for a, b in zip(cmd, cmd[1:], strict=False)):
                return True
    return False


def test_one_server_across_two_nodes_is_started_and_restarted_as_one(tiny_model, vllm_env):
    f = SshFleet(["gpu01", "gpu02"], fleet_name="span").start()
    try:
        port, rpc_port = free_port(), free_port()
        path = f.root / "unit.toml"
        path.write_text(layout(tiny_model, vllm_env, port, rpc_port))
        res = f.fleet("up", str(path), "--yes", "--timeout", "600", timeout=700)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert "starts on gpu01, gpu02 at once" in res.stdout

        # each node runs its own part and says where the rest lives
        head, follower = member(f, "gpu01"), member(f, "gpu02")
        assert head["state"] == "ready" and follower["state"] == "ready"
        assert head["span"]["head"] and head["span"]["node"] == "gpu01"
        assert not follower["span"]["head"] and follower["span"]["start_rank"] == 1
        assert [n["node"] for n in follower["span"]["nodes"]] == ["gpu01", "gpu02"]
        assert (follower["span"]["address"], follower["span"]["port"]) == ("127.0.0.1", port)
        shown = f.nodes["gpu02"].vsup("status").stdout
        assert f"gpu02 runs rank 1 of 2, headless; head gpu01 at 127.0.0.1:{port}" in shown
        # a request served by each rank, one of them on the other node
        assert served_by(port, 0) and served_by(port, 1)

        # the follower's vLLM dies: the head lies (/health 200) while rank 1 is gone
        victim = follower["pid"]
        os.killpg(os.getpgid(victim), signal.SIGKILL)
        t0 = time.monotonic()

        def serves_again() -> bool:
            h, fo = polled(f, "gpu01"), polled(f, "gpu02")
            return (
                h["state"] == "ready"
                and fo["state"] == "ready"
                and fo["pid"] != victim
                and served_by(port, 0, 10)
                and served_by(port, 1, 10)
            )

        until(serves_again, 600, "the unit serving again after its follower was killed", 2)
        healed_s = time.monotonic() - t0
        # the head restarted for the rank it could not reach, naming it and its node
        events = f.nodes["gpu01"].vsup("events", "--json", "--since", "all")
        restarts = [
            json.loads(line)
            for line in events.stdout.splitlines()
            if line.strip() and json.loads(line).get("kind") == "stall_restart"
        ]
        assert any("rank 1 on gpu02 did not answer" in (e.get("why") or "") for e in restarts), (
            events.stdout[-3000:]
        )
        print(f"\nthe unit served again {healed_s:.0f} s after the follower was killed")

        # `fleet up` of a change rolls the unit: both members restart on it, together
        pids = {n: polled(f, n)["pid"] for n in ("gpu01", "gpu02")}
        path.write_text(layout(tiny_model, vllm_env, port, rpc_port, "max-num-seqs = 32, "))
        t0 = time.monotonic()
        res = f.fleet("up", str(path), "--yes", "--timeout", "600", timeout=700)
        assert res.returncode == 0, (res.stdout, res.stderr)
        rolled_s = time.monotonic() - t0
        for n in ("gpu01", "gpu02"):
            now = polled(f, n)
            assert now["state"] == "ready" and now["pid"] != pids[n], (n, now)
            assert runs_flag(f.nodes[n].home, "--max-num-seqs", "32"), n
        assert served_by(port, 0) and served_by(port, 1)
        print(f"the change rolled over the unit in {rolled_s:.0f} s")

        # down on both nodes at once: no vLLM is left on either
        res = f.fleet("down", "--yes", timeout=400)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert "gpu01: its daemon has exited" in res.stdout
        assert "gpu02: its daemon has exited" in res.stdout
        for node in f.nodes.values():
            assert vllm_of(node.home) == [], node.name
    finally:
        f.close()
