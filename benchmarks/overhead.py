"""What the vsup daemon itself costs: its CPU while it watches N emulated vLLM servers at 1 Hz.

    python -m benchmarks.overhead --instances N [--seconds S] [--runs R] [--no-naive]

A daemon of its own (`python -m vsup daemon`, a temporary VSUP_HOME) supervises N vLLM
emulators (tests/programs/vllm_emulator.py: a payload recorded from the real vLLM 0.32 whose
values move; not vLLM). The daemon watches only processes it starts, so each instance is its
own emulator process (~20 MB each), started by the daemon from a layout of CPU instances
(`gpus = []`, `pull = false`: the emulator loads no model). They share the "cpu" device and
so start one after another; the layout is applied first with `health_interval_s = 0.1` to
make that quick, then again with the default 1 s, which the engine takes without a restart.
What is measured is the steady state: per
instance, one scrape a second, /health, /load and /metrics pipelined on one connection (the
engine's health loop takes that /health answer), + parse, rates, snapshot, history
(`--no-load-tracking`: without /load).

CPU is the daemon's own process accounting (user + system time of its pid, psutil), over R
windows of S seconds each; the figure is the median window, as % of one core.
`per_instance_poll_ms` = daemon CPU ms per instance per 1 s poll.

The naive approach, measured in the same run against the same emulators: a poller that opens a
new HTTP connection for every request (/health and /metrics, `http.client`) and parses every
scrape fully with prometheus_client (`text_string_to_metric_families`), one instance after
another each second. `naive_ratio` = naive CPU / daemon CPU.

`--at-rest K`: the first K emulators show an idle server (the emulator's `--mode-file` with
`idle`: no request, no figure moving), the others a busy one (`serve`, the default). An idle
instance is at rest (telemetry/rest.py) after a few scrapes and is then scraped only every
`rest_interval_s` (3 s by default) instead of every second: a packed node where most replicas
wait for work (sleep-mode time sharing). 0 (the default): every instance busy, the worst case.
The warm-up is then at least 10 s, so the idle ones are at rest before the windows.

`--status-every S`: a client of the benchmark's own asks `status` every S seconds during the
windows (as a dashboard does each second): a poll builds the status snapshot only when
something reads it each poll, so a daemon nobody asks builds none, and one a client asks builds
one per request after each poll (control/daemon.py `poll_once`). It also keeps every busy
instance on a scrape a second: nobody reading (no status request for 5 s), a busy instance is
scraped at the rest's pace, every 3 s (control/monitor.py, "Nobody watching"); without
`--status-every` the windows begin once the benchmark's own status request is 6 s old.

Last line: `instances=N daemon_cpu_pct=.. per_instance_poll_ms=.. naive_cpu_pct=..
naive_ratio=.. daemon_rss_mb=..`. Targets (issue 35): <= 2 % at 64 instances, <= 5 % at 128
(docs/benchmarks.md has the figures and what is left).
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    PYTHON,
    TOKEN_VAR,
    Daemon,
    bench_home,
    cpu_seconds,
    emulator_layout,
    free_ports,
    kill_token,
    last_line,
    median,
    new_token,
)

WANTED = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def naive_poller(ports: list[int], interval: float = 1.0) -> None:
    """The naive supervisor loop: new connection per request, full parse per scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    def get(port: int, path: str) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", path)
            return conn.getresponse().read()
        finally:
            conn.close()

    next_at = time.monotonic()
    while True:
        for port in ports:
            try:
                get(port, "/health")
                text = get(port, "/metrics").decode()
            except OSError:
                continue
            figures = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in WANTED:
                        figures[sample.name] = sample.value
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))


def windows(pid: int, runs: int, seconds: float) -> list[float]:
    """CPU % of one core of `pid` over `runs` consecutive windows of `seconds`."""
    out = []
    for _ in range(runs):
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        out.append(100.0 * (c1 - c0) / (t1 - t0))
    return out


def asking(home: Path, every_s: float) -> tuple[threading.Event, threading.Thread]:
    """A client asking the daemon's `status` every `every_s` seconds until the event is set."""
    from vsup.control.client import JsonClient

    stop = threading.Event()

    def ask() -> None:
        client = JsonClient(home, timeout=30)
        while not stop.wait(every_s):
            client.status()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return stop, thread


def measure(
    instances: int,
    seconds: float,
    runs: int,
    naive: bool,
    warmup: float,
    load: bool = True,
    status_every: float = 0.0,
    at_rest: int = 0,
) -> dict:
    import psutil

    token = new_token()
    ports = free_ports(instances)
    with bench_home() as home:
        daemon = Daemon(home, token)
        try:
            t0 = time.monotonic()
            # vsup adds --enable-server-load-tracking (vsup's vLLM has it): a /load read each
            # scrape; --no-load-tracking measures without it
            args = "" if load else "args = { enable-server-load-tracking = false }"
            # the first `at_rest` emulators show an idle server (their mode file), the rest serve
            modes = home / "modes"
            modes.mkdir()
            own = []
            for i in range(instances):
                if i < at_rest:
                    (modes / f"e{i:03d}").write_text("idle\n")
                    own.append(f'mode-file = "{modes / f"e{i:03d}"}"')
                else:
                    own.append("")
            fast = emulator_layout(
                "overhead", ports, token, args=args, health_interval_s=0.1, instance_args=own
            )
            result = daemon.client.apply(fast)
            if not result.get("applied"):
                raise RuntimeError(f"layout refused: {result['errors']}")
            daemon.wait_states({"ready"}, timeout=30 + 2.0 * instances)
            started_s = time.monotonic() - t0
            steady = emulator_layout("overhead", ports, token, args=args, instance_args=own)
            plan = daemon.client.apply(steady)["plan"]
            assert not plan["restart"] and not plan["start"], plan
            # an idle instance rests after a few quiet scrapes (telemetry/rest.py QUIET_SCRAPES)
            time.sleep(max(warmup, 10.0) if at_rest else warmup)
            status = daemon.client.status()
            scraped = sum(1 for i in status["instances"] if i["kv_cache_usage"] is not None)
            if scraped != instances:
                raise RuntimeError(f"the daemon shows metrics of {scraped}/{instances} instances")
            print(
                f"{instances} emulators ready in {started_s:.1f} s (serial: one cpu device; "
                f"{at_rest} idle); daemon pid {daemon.pid}",
                flush=True,
            )
            if status_every <= 0:
                # the status request above marks the daemon read for 5 s (control/monitor.py
                # WATCH_S): the windows measure it once nobody reads
                time.sleep(6.0)
            asked = asking(home, status_every) if status_every > 0 else None
            try:
                daemon_pct = windows(daemon.pid, runs, seconds)
            finally:
                if asked is not None:
                    asked[0].set()
                    asked[1].join()
            rss_mb = psutil.Process(daemon.pid).memory_info().rss / 2**20
            status = daemon.client.status()
            assert all(i["state"] == "ready" for i in status["instances"])
            print(
                "daemon cpu % per window: " + " ".join(f"{v:.2f}" for v in daemon_pct), flush=True
            )
            naive_pct: list[float] = []
            if naive:
                env = dict(os.environ, **{TOKEN_VAR: token})
                env["PYTHONPATH"] = str(ROOT)
                poller = subprocess.Popen(
                    [
                        PYTHON,
                        "-m",
                        "benchmarks.overhead",
                        "--naive-poller",
                        ",".join(map(str, ports)),
                    ],
                    cwd=str(ROOT),
                    env=env,
                )
                try:
                    time.sleep(warmup)
                    naive_pct = windows(poller.pid, runs, seconds)
                finally:
                    poller.kill()
                    poller.wait()
                print(
                    "naive cpu % per window: " + " ".join(f"{v:.2f}" for v in naive_pct), flush=True
                )
        finally:
            daemon.close()
            left = kill_token(token)
            if left:
                print(f"warning: killed {len(left)} processes left behind: {left}", file=sys.stderr)
    d = median(daemon_pct)
    out = {
        "instances": instances,
        "at_rest": at_rest,
        "daemon_cpu_pct": d,
        "per_instance_poll_ms": d * 10.0 / instances,  # % of a core over 1 s = 10 ms
    }
    if naive_pct:
        n = median(naive_pct)
        out.update(naive_cpu_pct=n, naive_ratio=n / d if d > 0 else float("inf"))
    out["daemon_rss_mb"] = rss_mb
    if status_every > 0:
        out["status_every_s"] = status_every
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of one window")
    ap.add_argument("--runs", type=int, default=5, help="measurement windows (median)")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--no-naive", action="store_true", help="skip the naive poller")
    ap.add_argument(
        "--no-load-tracking", action="store_true", help="instances without /load (one GET less)"
    )
    ap.add_argument(
        "--status-every",
        type=float,
        default=0.0,
        metavar="S",
        help="a client asks status every S seconds during the windows (0: none)",
    )
    ap.add_argument(
        "--at-rest",
        type=int,
        default=0,
        metavar="K",
        help="the first K emulators show an idle server (at rest: scraped every rest_interval_s)",
    )
    ap.add_argument("--naive-poller", metavar="PORTS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.naive_poller:
        naive_poller([int(p) for p in args.naive_poller.split(",")])
        return 0
    out = measure(
        args.instances,
        args.seconds,
        args.runs,
        not args.no_naive,
        args.warmup,
        load=not args.no_load_tracking,
        status_every=args.status_every,
        at_rest=args.at_rest,
    )
    print(last_line(**out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
