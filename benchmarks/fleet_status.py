"""`vsup fleet status` over 16 nodes: cold and warm, and the fleet dashboard's CPU.

    python -m benchmarks.fleet_status [--nodes 16] [--rounds 20] [--cold-rounds 5]
                                      [--instances 1] [--dashboard-s 30]

Every node is a real OpenSSH server on 127.0.0.1 (its own port, host key, sshd_config) with
its own VSUP_HOME and a real vsup daemon (`--instances N` vLLM emulators each, default 1: a
light daemon; 0: a daemon with no layout), as tests/integration/fleet/sshnodes.py builds
them. The operator side is a key, a known_hosts, an ssh_config of Host aliases and a fleet
file.

- cold: every ControlMaster ended and the tunnels forgotten first, so each run makes 16 SSH
  connections (key exchange, authentication, host key check), runs each node's own
  `vsup paths --json` and forwards its socket, then asks for the status;
- warm: the masters and tunnels from the run before are there, as for an operator who ran it
  a moment ago (ControlPersist 600 s): 16 HTTP requests through 16 SSH channels.
Both are the whole command as the operator runs it (`python -m vsup fleet status --json`,
Python start-up included), wall time. `inprocess` is the warm query alone
(`FleetClient.status_all`, no start-up). The dashboard figure is the headless `FleetApp`
polling all nodes every 2 s (its default) for `--dashboard-s`: this process's CPU over that
window, in % of one core. The client and all 16 nodes share this machine's cores, so the
figures include the nodes' side too; on a real fleet each node pays its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import install_cleanup, last_line, median, percentile  # noqa: E402
from tests.integration.fleet.conftest import node_layout  # noqa: E402
from tests.integration.fleet.sshnodes import SshFleet, free_port, sshd_missing  # noqa: E402

CPU: list[float] = []  # CPU seconds (user + system) of each command, ssh children included


def vsup_fleet(fleet: SshFleet, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    env = dict(os.environ, VSUP_HOME=str(fleet.operator_home))
    cmd = [sys.executable, "-m", "vsup", "fleet", args[0], "--fleet", str(fleet.fleet_file)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, *args[1:]], env=env, capture_output=True, text=True, timeout=300, cwd="/"
    )
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return took, proc


def forget_tunnels(fleet: SshFleet) -> None:
    run = fleet.operator_home / "fleet"
    for cm in run.glob("cm-*"):
        subprocess.run(
            ["ssh", "-F", str(fleet.ssh_config), "-o", f"ControlPath={cm}", "-O", "exit", "x"],
            capture_output=True,
            timeout=10,
        )
    for p in run.glob("*"):
        if p.suffix in (".json", ".sock") or p.name.startswith("cm-"):
            p.unlink(missing_ok=True)
    time.sleep(0.5)  # the masters' connections close on the nodes


def check(proc: subprocess.CompletedProcess, nodes: int) -> None:
    doc = json.loads(proc.stdout)
    up = [n for n in doc["nodes"] if n["reachable"] and n["daemon"]]
    if len(up) != nodes:
        down = {n["name"]: n["error"] for n in doc["nodes"] if n not in up}
        raise SystemExit(f"not every node answered: {down}")


def dashboard_cpu(fleet: SshFleet, seconds: float) -> tuple[float, int]:
    os.environ["VSUP_HOME"] = str(fleet.operator_home)
    from vsup.fleet.model import load_fleet
    from vsup.tui.fleet_app import FleetApp

    async def run() -> tuple[float, int]:
        app = FleetApp(load_fleet(fleet.fleet_file), refresh_s=2.0)
        async with app.run_test(size=(160, 45)) as pilot:
            for _ in range(600):
                if app.fleet_polls >= 2:
                    break
                await pilot.pause(0.1)
            t0, c0, p0 = time.monotonic(), time.process_time(), app.fleet_polls
            await pilot.pause(seconds)
            cpu = (time.process_time() - c0) / (time.monotonic() - t0) * 100
            polls = app.fleet_polls - p0
            await pilot.press("q")
        return cpu, polls

    return asyncio.run(run())


def inprocess_warm(fleet: SshFleet, rounds: int) -> list[float]:
    os.environ["VSUP_HOME"] = str(fleet.operator_home)
    from vsup.fleet.model import load_fleet
    from vsup.fleet.query import FleetClient

    async def run() -> list[float]:
        out = []
        async with FleetClient(load_fleet(fleet.fleet_file)) as fc:
            await fc.status_all()
            for _ in range(rounds):
                t0 = time.perf_counter()
                await fc.status_all()
                out.append(time.perf_counter() - t0)
        return out

    return asyncio.run(run())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--cold-rounds", type=int, default=5)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--dashboard-s", type=float, default=30.0)
    args = ap.parse_args()
    install_cleanup()  # SIGTERM/SIGHUP end it through `finally`: no node left running
    why = sshd_missing()
    if why:
        print(f"skipped: {why}")
        return 0
    fleet = SshFleet([f"n{i:02d}" for i in range(args.nodes)], fleet_name="bench").start()
    try:
        for name, node in fleet.nodes.items():
            if not args.instances:
                res = node.vsup("daemon", "--detach")  # a daemon with no layout
                if res.returncode != 0:
                    raise SystemExit(f"{name}: {res.stderr}")
                continue
            path = fleet.root / f"{name}.toml"
            ports = {f"{name}i{j}": free_port() for j in range(args.instances)}
            path.write_text(node_layout(f"bench-{name}", ports))
            res = node.vsup("up", str(path), "--detach", "--wait", "--timeout", "120")
            if res.returncode != 0:
                raise SystemExit(f"{name}: {res.stderr}")
        cold = []
        for _ in range(args.cold_rounds):
            forget_tunnels(fleet)
            took, proc = vsup_fleet(fleet, "status", "--json")
            check(proc, args.nodes)
            cold.append(took)
        cold_cpu = list(CPU)
        CPU.clear()
        warm = []
        for _ in range(args.rounds):
            took, proc = vsup_fleet(fleet, "status", "--json")
            check(proc, args.nodes)
            warm.append(took)
        warm_cpu = list(CPU)
        load = os.getloadavg()[0]
        inproc = inprocess_warm(fleet, args.rounds)
        cpu, polls = dashboard_cpu(fleet, args.dashboard_s)
        ms = lambda xs, q: round(percentile(xs, q) * 1000)  # noqa: E731
        print(f"nodes={args.nodes} instances/node={args.instances}")
        print(
            f"cold: median {median(cold) * 1000:.0f} ms, p99 {ms(cold, 99)} ms ({len(cold)} runs)"
        )
        print(
            f"warm: median {median(warm) * 1000:.0f} ms, p99 {ms(warm, 99)} ms ({len(warm)} runs)"
        )
        print(
            f"CPU of the command: cold median {median(cold_cpu) * 1000:.0f} ms, warm median "
            f"{median(warm_cpu) * 1000:.0f} ms (load average {load:.1f} on {os.cpu_count()} cores)"
        )
        print(f"warm in-process: median {median(inproc) * 1000:.1f} ms, p99 {ms(inproc, 99)} ms")
        print(f"dashboard: {cpu:.1f}% of a core over {args.dashboard_s:.0f} s ({polls} polls)")
        print(
            last_line(
                nodes=args.nodes,
                cold_median_ms=round(median(cold) * 1000),
                cold_p99_ms=ms(cold, 99),
                warm_median_ms=round(median(warm) * 1000),
                warm_p99_ms=ms(warm, 99),
                cold_cpu_ms=round(median(cold_cpu) * 1000),
                warm_cpu_ms=round(median(warm_cpu) * 1000),
                load=round(load, 1),
                inprocess_median_ms=round(median(inproc) * 1000, 1),
                inprocess_p99_ms=ms(inproc, 99),
                dashboard_cpu_pct=round(cpu, 1),
            )
        )
    finally:
        fleet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
