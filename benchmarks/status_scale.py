"""`vsup status` on a node of many instances: how long the CLI takes, how long the daemon takes
to answer, and what pollers of the status cost the daemon.

    python -m benchmarks.status_scale --instances 128 [--runs R] [--pollers P] [--seconds S]

A daemon of its own (`python -m vsup daemon`, a temporary VSUP_HOME) supervises N vLLM
emulators (tests/programs/vllm_emulator.py, one process each, ~15 MB; not vLLM), all ready and
scraped at 1 Hz. Then:
- `cli_status_ms`, `cli_status_json_ms`, `cli_version_ms`: wall time of `python -m vsup
  status`, `python -m vsup status --json` and `python -m vsup --version` (the CLI's start-up
  alone) as a user runs them (a new process each time, output to a pipe), R runs each; p50
  and p99 (nearest rank);
- `api_status_ms`: one GET /v1/status through the control client from a warm process (the
  daemon's part: snapshot, JSON, the socket), R requests;
- `daemon_cpu_pct` (no client) and `daemon_cpu_pollers_pct` (P threads each calling
  GET /v1/status once a second, like P dashboards): the daemon pid's CPU, % of one core, over
  windows of S seconds (median of 3).

Before/after figures of another copy of vsup (e.g. an earlier commit, `git archive REV
supervisor | tar -x -C /tmp/old`): `PYTHONPATH=/tmp/old/supervisor python -m
benchmarks.status_scale ...` runs the daemon, the CLI and the client from that copy.

Last line: `instances=N cli_status_p50_ms=.. cli_status_p99_ms=.. cli_status_json_p50_ms=..
cli_status_json_p99_ms=.. cli_version_p50_ms=.. cli_version_p99_ms=.. api_status_p50_ms=..
api_status_p99_ms=.. daemon_cpu_pct=.. daemon_cpu_pollers_pct=.. pollers=P`. Target: `vsup
status` at 128 instances within 200 ms.
"""

from __future__ import annotations

import argparse
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
    Daemon,
    bench_home,
    cpu_seconds,
    emulator_layout,
    free_ports,
    kill_token,
    last_line,
    median,
    new_token,
    percentile,
)


def cli_times(home: Path, args: list[str], runs: int) -> list[float]:
    """Wall seconds of `python -m vsup ARGS`, a fresh process per run, outside the checkout
    (the installed package, unless PYTHONPATH points at another copy of vsup)."""
    env = dict(os.environ, VSUP_HOME=str(home))
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [PYTHON, "-m", "vsup", *args], env=env, cwd="/", capture_output=True, timeout=120
        )
        out.append(time.perf_counter() - t0)
        if proc.returncode not in (0, 1) or not proc.stdout:
            raise RuntimeError(f"vsup {' '.join(args)} failed: {proc.stderr.decode()[-400:]}")
    return out


def cpu_window(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def measure(instances: int, runs: int, pollers: int, seconds: float) -> dict:
    from vsup.control.client import JsonClient

    token = new_token()
    ports = free_ports(instances)
    with bench_home() as home:
        daemon = Daemon(home, token)
        try:
            t0 = time.monotonic()
            result = daemon.client.apply(
                emulator_layout("status-scale", ports, token, health_interval_s=0.1)
            )
            if not result.get("applied"):
                raise RuntimeError(f"layout refused: {result['errors']}")
            daemon.wait_states({"ready"}, timeout=60 + 3.0 * instances)
            daemon.client.apply(emulator_layout("status-scale", ports, token))
            print(
                f"{instances} emulators ready in {time.monotonic() - t0:.0f} s; "
                f"daemon pid {daemon.pid}",
                flush=True,
            )
            time.sleep(3.0)  # every instance scraped
            status = daemon.client.status()
            scraped = sum(1 for i in status["instances"] if i["kv_cache_usage"] is not None)
            if scraped != instances:
                raise RuntimeError(f"the daemon shows metrics of {scraped}/{instances}")
            print(f"status document: {len(str(status)) // 1024} KiB (repr)", flush=True)

            api = []
            with JsonClient(home, timeout=60) as client:
                for _ in range(runs):
                    t = time.perf_counter()
                    client.status()
                    api.append(time.perf_counter() - t)
                    time.sleep(0.05)
            text = cli_times(home, ["status"], runs)
            js = cli_times(home, ["status", "--json"], runs)
            version = cli_times(home, ["--version"], runs)

            idle = median([cpu_window(daemon.pid, seconds) for _ in range(3)])
            stop = threading.Event()

            def poll() -> None:
                with JsonClient(home, timeout=60) as client:
                    while not stop.is_set():
                        client.status()
                        stop.wait(1.0)

            threads = [threading.Thread(target=poll, daemon=True) for _ in range(pollers)]
            for th in threads:
                th.start()
            time.sleep(2.0)
            polled = median([cpu_window(daemon.pid, seconds) for _ in range(3)])
            stop.set()
            for th in threads:
                th.join(10)
        finally:
            daemon.close()
            left = kill_token(token)
            if left:
                print(f"warning: killed {len(left)} processes left behind", file=sys.stderr)
    ms = 1000.0
    return {
        "instances": instances,
        "cli_status_p50_ms": median(text) * ms,
        "cli_status_p99_ms": percentile(text, 99) * ms,
        "cli_status_json_p50_ms": median(js) * ms,
        "cli_status_json_p99_ms": percentile(js, 99) * ms,
        "cli_version_p50_ms": median(version) * ms,
        "cli_version_p99_ms": percentile(version, 99) * ms,
        "api_status_p50_ms": median(api) * ms,
        "api_status_p99_ms": percentile(api, 99) * ms,
        "daemon_cpu_pct": idle,
        "daemon_cpu_pollers_pct": polled,
        "pollers": pollers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=128)
    ap.add_argument("--runs", type=int, default=20, help="CLI runs and API requests (each)")
    ap.add_argument("--pollers", type=int, default=8, help="1 Hz status pollers")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of one CPU window")
    args = ap.parse_args(argv)
    print(last_line(**measure(args.instances, args.runs, args.pollers, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
