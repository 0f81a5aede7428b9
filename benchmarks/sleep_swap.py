"""Where a swap's time goes: vsup's swap, step by step, against vLLM's own endpoints.

    python -m benchmarks.sleep_swap [--runs 6] [--sleep-s 0.42] [--wake-s 0.81] [--router]
    python -m benchmarks.sleep_swap --home $VSUP_HOME --pair a b [--runs 6]

Two modes:
- emulators (the default): a daemon of its own, in this process, with two vLLM emulators in one
  swap group whose fake HBM (tests/unit/control/fakehbm.py) the real NvmlProbe reads as the
  GPU's memory (64 GiB awake, 1.7 GiB asleep, as an 8B server at 0.90 of an H200). The
  emulators' sleep and wake take `--sleep-s`/`--wake-s` (default: vLLM's own figures on the
  H200, docs/gpu-runs), so what vsup adds shows against a known floor. `--router` puts the
  real vllm-router in front (leaving and rejoining it are steps of the swap).
- a running daemon (`--home`, `--pair A B`): the instances of `vsup up` on a GPU with real
  vLLM, the release read from NVML. On the H200: benchmarks/gpu_bench/sleep_floor.sh (its
  header has the two device calls of ../shared/gpu-vllm), which runs `vsup up` of two 8B-shape
  servers in one swap group and then `python3 benchmarks/sleep_swap.py --home "$VSUP_HOME"
  --pair a b --runs 6`.

Each mode first swaps `--warmup` times uncounted (a GPU's first level-1 sleep of a server pins
its host buffer: 9-14 s), then `--runs` swaps back and forth through the daemon's API (as
`vsup swap` does): the wall time of the call, vsup's own `took_s` and its phases (leave
router, drain, /sleep, release seen, /wake_up, first answer, rejoin router). Then the same
number of swaps by hand with vLLM's endpoints: `POST /sleep?level=1&mode=wait` on the awake
one, `POST /wake_up` on the other, one `max_tokens = 1` completion. Medians.

Last line: `vsup_swap_s=.. vsup_wall_s=.. raw_swap_s=.. over_raw_s=.. raw_sleep_s=..
raw_wake_s=.. raw_answer_s=..` then each phase's median as `vsup_<phase>=..`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from vsup import paths  # noqa: E402
from vsup.control.client import AsyncJsonClient  # noqa: E402

from benchmarks.common import EMULATOR, PYTHON, free_ports, last_line  # noqa: E402

ROUTER = Path(PYTHON).parent / "vllm-router"


async def vsup_swaps(
    client: AsyncJsonClient, pair: tuple[str, str], runs: int, warmup: int
) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """`runs` swaps through the daemon (after `warmup` uncounted): wall times, vsup's
    took_s, each phase's figures."""
    walls: list[float] = []
    tooks: list[float] = []
    phases: dict[str, list[float]] = {}
    a, b = pair
    for n in range(warmup + runs):
        src, dst = (a, b) if n % 2 == 0 else (b, a)
        t0 = time.monotonic()
        answer = await client.action("swap", [src, dst])
        wall = time.monotonic() - t0
        if answer.get("errors"):
            raise RuntimeError(f"swap {src} {dst}: {answer['errors']}")
        result = answer["result"]
        steps = result.get("phases") or {}
        print(f"vsup swap {src} -> {dst}: wall {wall:.3f} s, took {result['took_s']} s {steps}")
        if n < warmup:
            continue
        walls.append(wall)
        tooks.append(float(result["took_s"]))
        for key, value in steps.items():
            phases.setdefault(key, []).append(float(value))
    return walls, tooks, phases


async def raw_swaps(
    urls: dict[str, str], pair: tuple[str, str], runs: int
) -> dict[str, list[float]]:
    """`runs` swaps with vLLM's own endpoints: sleep, wake, one completion."""
    out: dict[str, list[float]] = {"sleep": [], "wake": [], "answer": [], "swap": []}
    a, b = pair
    async with httpx.AsyncClient(timeout=600) as http:
        models = {}
        for name, url in urls.items():
            doc = (await http.get(url + "/v1/models")).json()
            models[name] = doc["data"][0]["id"]
        for n in range(runs):
            src, dst = (a, b) if n % 2 == 0 else (b, a)
            t0 = time.monotonic()
            r = await http.post(urls[src] + "/sleep?level=1&mode=wait")
            t1 = time.monotonic()
            w = await http.post(urls[dst] + "/wake_up")
            t2 = time.monotonic()
            body = {"model": models[dst], "prompt": ".", "max_tokens": 1}
            c = await http.post(urls[dst] + "/v1/completions", json=body)
            t3 = time.monotonic()
            if {r.status_code, w.status_code, c.status_code} != {200}:
                raise RuntimeError(f"raw swap {src} {dst}: {r.status_code} {w.status_code} {c}")
            out["sleep"].append(t1 - t0)
            out["wake"].append(t2 - t1)
            out["answer"].append(t3 - t2)
            out["swap"].append(t3 - t0)
            print(f"raw swap {src} -> {dst}: {t3 - t0:.3f} s")
    return out


async def instance_urls(client: AsyncJsonClient, pair: tuple[str, str]) -> dict[str, str]:
    doc = await client.status()
    by_name = {i["name"]: i for i in doc["instances"]}
    return {n: f"http://127.0.0.1:{by_name[n]['port']}" for n in pair}


async def wait_settled(client: AsyncJsonClient, pair: tuple[str, str], timeout: float) -> None:
    """Until one of the pair is awake and the other asleep, both ready."""
    deadline = time.monotonic() + timeout
    while True:
        doc = await client.status()
        states = {
            i["name"]: (i["state"], (i.get("sleep") or {}).get("state"))
            for i in doc["instances"]
            if i["name"] in pair
        }
        if sorted(states.values()) == [("ready", "asleep"), ("ready", "awake")]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not one awake and one asleep after {timeout} s: {states}")
        await asyncio.sleep(0.2)


def emulator_layout(gpus: Any, sleep_s: float, wake_s: float, router: bool) -> str:
    cmd = json.dumps([PYTHON, str(EMULATOR)])
    ports = free_ports(4)
    text = f"""[layout]
name = "sleep-swap-bench"

[defaults]
model = "bench/emulated"
pull = false
command = {cmd}
host = "127.0.0.1"
health_interval_s = 1.0
gpu_memory_utilization = 0.90
sleep = {{ level = 1 }}
"""
    if router:
        text += f"""
[router]
port = {ports[2]}
metrics_port = {ports[3]}
host = "127.0.0.1"
policy = "round_robin"
command = {json.dumps([str(ROUTER)])}
"""
    for i, name in enumerate(("a", "b")):
        args = gpus.args(0, name, 64.0, 1.7)
        args.update({"sleep-s": str(sleep_s), "wake-s": str(wake_s)})
        args["enable-server-load-tracking"] = True
        # idle figures (the emulator's default shows requests running all the time, which a
        # sleep's drain would wait for); its own completions still count in /load
        mode = gpus.root / f"{name}.mode"
        mode.write_text("idle")
        args["mode-file"] = str(mode)
        inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
        text += f'\n[[instance]]\nname = "{name}"\nport = {ports[i]}\ngpus = [0]\n'
        text += f'swap_group = "g0"\nargs = {{ {inline} }}\n'
    return text


async def run_emulators(args: argparse.Namespace) -> dict[str, Any]:
    from vsup.control.daemon import Daemon
    from vsup.control.server import bind_unix_socket

    from tests.unit.control.fakehbm import FakeHbmGpus

    pair = ("a", "b")
    with tempfile.TemporaryDirectory(prefix="vsup-bench-", dir="/tmp") as tmp:
        home = Path(tmp)
        gpus = FakeHbmGpus(home / "hbm", count=1)
        # the daemon's own poll (1 s, as `vsup daemon` runs): the release is not awaited on it
        daemon = Daemon(home, poll_interval=1.0, gpu_probe=gpus.probe())
        sock = bind_unix_socket(paths.socket_path(home))
        task = asyncio.create_task(daemon.serve(sock, handle_signals=False))
        client = AsyncJsonClient(home)
        try:
            for _ in range(200):
                with contextlib.suppress(Exception):
                    await client.ping()
                    break
                await asyncio.sleep(0.05)
            text = emulator_layout(gpus, args.sleep_s, args.wake_s, args.router)
            answer = await client.apply(text, str(home / "layout.toml"))
            if not answer.get("applied"):
                raise RuntimeError(f"apply: {answer}")
            await wait_settled(client, pair, 120)
            return await measure(client, pair, args)
        finally:
            with contextlib.suppress(Exception):
                await client.shutdown(stop_instances=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 60)


async def run_daemon(args: argparse.Namespace) -> dict[str, Any]:
    pair = (args.pair[0], args.pair[1])
    client = AsyncJsonClient(Path(args.home))
    await wait_settled(client, pair, 1800)
    return await measure(client, pair, args)


async def measure(
    client: AsyncJsonClient, pair: tuple[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    doc = await client.status()
    awake = [
        i["name"]
        for i in doc["instances"]
        if i["name"] in pair and (i.get("sleep") or {}).get("state") == "awake"
    ]
    first = (awake[0], next(n for n in pair if n != awake[0]))
    runs = args.runs + args.runs % 2  # back where it began
    walls, tooks, phases = await vsup_swaps(client, first, runs, args.warmup + args.warmup % 2)
    raw = await raw_swaps(await instance_urls(client, first), first, runs)
    return {"wall": walls, "took": tooks, "phases": phases, "raw": raw}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="uncounted swaps first")
    p.add_argument("--sleep-s", type=float, default=0.42, help="the emulators' /sleep")
    p.add_argument("--wake-s", type=float, default=0.81, help="the emulators' /wake_up")
    p.add_argument("--router", action="store_true", help="vllm-router in front (emulators)")
    p.add_argument("--home", help="a running daemon's VSUP_HOME (real vLLM)")
    p.add_argument("--pair", nargs=2, metavar=("A", "B"), help="with --home: the two to swap")
    args = p.parse_args()
    if args.home and not args.pair:
        p.error("--home needs --pair A B")
    run = run_daemon if args.home else run_emulators
    figures = asyncio.run(run(args))
    med = statistics.median
    raw = figures["raw"]
    out: dict[str, object] = {
        "vsup_swap_s": med(figures["took"]),
        "vsup_wall_s": med(figures["wall"]),
        "raw_swap_s": med(raw["swap"]),
        "over_raw_s": med(figures["took"]) - med(raw["swap"]),
        "raw_sleep_s": med(raw["sleep"]),
        "raw_wake_s": med(raw["wake"]),
        "raw_answer_s": med(raw["answer"]),
    }
    for key, values in figures["phases"].items():
        out[f"vsup_{key}"] = med(values)
    print(last_line(**out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
