"""What a router restart costs the requests sent through it: the gap a `[router]` change makes.

    python -m benchmarks.router_restart [--rounds N] [--interval-ms MS]

A vsup daemon of its own runs two vLLM emulator instances and the real vllm-router (the
`router` extra) in front of them, all on 127.0.0.1. One client sends a one-token completion
through the router every MS milliseconds (one at a time, 5 s timeout) while the layout is
applied N times with the router's policy switched (round_robin <-> random), as
`vsup up --yes` does: each apply restarts the router. Per round:
- `gap_s`: from the last answered request before the first failure to the first answered one
  after it (what a client sees: the endpoint is down for this long);
- `failed`: requests that failed in that round (refused connections, 503 with no worker yet).

And from the daemon's journal, per restart (medians): `stop_s` from the restart's action to the
old router's exit (its graceful shutdown), `start_s` from the new one's spawn to vsup seeing it
listen (`ready`: mostly vllm-router's Python launcher loading its Rust core), `join_s` from
then to both workers added through its API.

Last line: `rounds=.. gap_p50_s=.. gap_min_s=.. gap_max_s=.. failed_p50=.. stop_p50_s=..
start_p50_s=.. join_p50_s=.. interval_ms=..`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.common import (  # noqa: E402
    PYTHON,
    Daemon,
    bench_home,
    emulator_layout,
    free_ports,
    last_line,
    new_token,
)

ROUTER = Path(PYTHON).parent / "vllm-router"


class Client(threading.Thread):
    """Sends a completion every `interval_s`; records (monotonic time sent, answered ok)."""

    def __init__(self, url: str, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval_s = interval_s
        self.results: list[tuple[float, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"model": "bench/emulated", "prompt": "hi", "max_tokens": 1}
        with httpx.Client(timeout=5.0) as http:
            while not self.stop.is_set():
                t = time.monotonic()
                try:
                    ok = http.post(self.url, json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.results.append((t, ok))
                self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - t)))


def gap(results: list[tuple[float, bool]]) -> tuple[float, int]:
    """(seconds from the last success before the first failure to the first success after
    the last failure, failures); (0, 0) when nothing failed."""
    failed = [i for i, (_, ok) in enumerate(results) if not ok]
    if not failed:
        return 0.0, 0
    before = max((i for i in range(failed[0]) if results[i][1]), default=failed[0])
    after = min((i for i in range(failed[-1], len(results)) if results[i][1]), default=failed[-1])
    return results[after][0] - results[before][0], len(failed)


def phases(journal: Path) -> dict[str, list[float]]:
    """stop_s, start_s, join_s of every router restart in the daemon's journal."""
    events = [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]
    out: dict[str, list[float]] = {"stop_s": [], "start_s": [], "join_s": []}
    at: dict[str, float] = {}
    for e in events:
        if "router" not in e:
            continue
        t = datetime.fromisoformat(e["t"].replace("Z", "+00:00")).timestamp()
        kind = e["kind"]
        if kind == "action" and e.get("action") == "restart":
            at = {"restart": t}
        elif "restart" not in at:
            continue
        elif kind == "exit" and "exit" not in at:
            at["exit"] = t
            out["stop_s"].append(t - at["restart"])
        elif kind == "spawn" and "exit" in at:
            at["spawn"] = t
        elif kind == "ready" and "spawn" in at:
            at["ready"] = t
            out["start_s"].append(t - at["spawn"])
        elif kind == "router_workers" and "ready" in at and len(e.get("add") or ()) == 2:
            out["join_s"].append(t - at["ready"])
            at = {}
    return out


def router_ready(daemon: Daemon, pid: int | None) -> dict | None:
    """The router's status once it serves both members with a process other than `pid`."""
    router = daemon.client.status().get("router") or {}
    members = [w for w in router.get("workers", ()) if w.get("wanted")]
    if (
        router.get("state") == "ready"
        and router.get("pid") != pid
        and len(members) == 2
        and all(w.get("in_router") for w in members)
    ):
        return router
    return None


def wait_router(daemon: Daemon, pid: int | None, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while (router := router_ready(daemon, pid)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the router does not serve: {daemon.client.status().get('router')}")
        time.sleep(0.05)
    return router


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--interval-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    if not ROUTER.exists():
        print(f"no {ROUTER}: install the router extra (pip install 'vsup[router]')")
        return 2
    token = new_token()
    a, b, port, metrics = free_ports(4)

    def layout(policy: str) -> str:
        return emulator_layout("router-restart", [a, b], token, health_interval_s=0.2) + (
            f'\n[router]\nport = {port}\nmetrics_port = {metrics}\nhost = "127.0.0.1"\n'
            f'policy = "{policy}"\ncommand = ["{ROUTER}"]\n'
        )

    gaps: list[float] = []
    fails: list[int] = []
    with bench_home() as home:
        daemon = Daemon(home, token, poll_interval=0.5)
        try:
            daemon.client.apply(layout("round_robin"), str(home / "layout.toml"), pull=False)
            pid = wait_router(daemon, None)["pid"]
            for i in range(args.rounds):
                client = Client(f"http://127.0.0.1:{port}/v1/completions", args.interval_ms / 1e3)
                client.start()
                time.sleep(1.0)  # answered requests before the restart
                policy = "random" if i % 2 == 0 else "round_robin"
                daemon.client.apply(layout(policy), str(home / "layout.toml"), pull=False)
                pid = wait_router(daemon, pid)["pid"]
                time.sleep(1.0)  # and after it
                client.stop.set()
                client.join()
                g, n = gap(client.results)
                gaps.append(g)
                fails.append(n)
                print(f"round {i + 1}: policy {policy}: gap {g:.3f} s, {n} failed", flush=True)
        finally:
            daemon.close()
        parts = phases(home / "journal.jsonl")
    print(
        last_line(
            rounds=args.rounds,
            gap_p50_s=statistics.median(gaps),
            gap_min_s=min(gaps),
            gap_max_s=max(gaps),
            failed_p50=statistics.median(fails),
            **{
                f"{k[:-2]}_p50_s": statistics.median(v) if v else float("nan")
                for k, v in parts.items()
            },
            interval_ms=args.interval_ms,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
