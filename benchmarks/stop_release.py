"""How long `stop` takes until no process of the instance is left.

    python -m benchmarks.stop_release [--runs 5] [--vllm-runs 3] [--grace 2] [--no-vllm]

Through a daemon of its own (temporary VSUP_HOME), as `vsup stop NAME` does it: POST
/v1/actions stop (wait), timed from the request to its answer. The daemon answers once its
engine verified that no process of the instance's tree is left; the benchmark checks that
independently too: before the stop it lists the instance's process group (and descendants),
and a watcher thread scanning /proc every 2 ms records when the last of them disappeared
(`*_gone_ms`). It fails if anything of the group is left after the answer.

- `vllm`: a real CPU vLLM 0.32 (the generated tiny Llama, `profiles = ["cpu"]`: float32,
  --enforce-eager, 1 GiB KV cache): API server, EngineCore and worker. Each run starts it
  (~30 s here), waits for ready, stops it. Runs under /tmp/vsup-vllm.lock (one real vLLM
  run at a time on this machine). Default 3 runs: each costs a vLLM start-up.
- `emulator`: the vLLM emulator (not vLLM) with an EngineCore child, which honours SIGTERM.
- `ignore_term`: the emulator ignoring SIGTERM, `stop_grace_s = GRACE`: vsup must SIGKILL the
  group after the grace period. Target: grace + at most 1 s.

Last line: `vllm_stop_ms=.. vllm_gone_ms=.. emulator_stop_ms=.. ignore_term_stop_ms=..
ignore_term_over_grace_ms=.. grace_s=..` (medians over the runs).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.engine.proc import process_table, read_stat, same_process  # noqa: E402

from benchmarks.common import (  # noqa: E402
    TOKEN_VAR,
    Daemon,
    bench_home,
    emulator_layout,
    free_ports,
    kill_token,
    last_line,
    median,
    new_token,
)

VLLM_LOCK = "/tmp/vsup-vllm.lock"
MODEL_DIR = ROOT / ".bench" / "models" / "tiny-llama"


def tree_of(pgid: int) -> dict[int, float]:
    """pid -> start time of every live process in group `pgid` and their descendants (walked
    here, not with the engine's live_tree: this checks the engine's claim that none is left)."""
    table = process_table()
    found = {p: i.create_time for p, i in table.items() if i.pgid == pgid and i.state != "Z"}
    grew = True
    while grew:
        grew = False
        for p, info in table.items():
            if info.ppid in found and p not in found and info.state != "Z":
                found[p] = info.create_time
                grew = True
    return found


def alive(pid: int, start: float) -> bool:
    info = read_stat(pid)
    return info is not None and info.state != "Z" and same_process(info.create_time, start)


class GoneWatcher(threading.Thread):
    """Records when the last of `members` stopped existing (scans every 2 ms)."""

    def __init__(self, members: dict[int, float]) -> None:
        super().__init__(daemon=True)
        self.members = dict(members)
        self.gone_at: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.members = {p: s for p, s in self.members.items() if alive(p, s)}
            if not self.members:
                self.gone_at = time.monotonic()
                return
            time.sleep(0.002)


def timed_stop(daemon: Daemon, name: str) -> tuple[float, float, int]:
    """(ms to the stop's answer, ms until the last process was gone, processes in the tree)."""
    inst = next(i for i in daemon.client.status()["instances"] if i["name"] == name)
    members = tree_of(inst["pid"])
    watcher = GoneWatcher(members)
    t0 = time.monotonic()
    watcher.start()
    answer = daemon.client.action("stop", [name])
    t1 = time.monotonic()
    watcher.join(timeout=5)
    watcher.done.set()
    if answer.get("errors") or name not in answer.get("done", []):
        raise RuntimeError(f"stop of {name} failed: {answer}")
    left = {p: s for p, s in members.items() if alive(p, s)} | tree_of(inst["pid"])
    if left:
        raise RuntimeError(f"processes of {name} left after its stop: {sorted(left)}")
    gone = (watcher.gone_at - t0) * 1e3 if watcher.gone_at else (t1 - t0) * 1e3
    return (t1 - t0) * 1e3, gone, len(members)


def emulator_runs(runs: int, grace: float, token: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "emulator_stop": [],
        "emulator_gone": [],
        "ignore_term_stop": [],
        "ignore_term_gone": [],
    }
    ports = free_ports(2)
    with bench_home() as home:
        daemon = Daemon(home, token)
        try:
            layout = emulator_layout(
                "stop", ports, token, health_interval_s=0.1, stop_grace_s=grace
            )
            # e000 honours SIGTERM, e001 ignores it; both have an EngineCore child
            layout = layout.replace(
                f"port = {ports[0]}\n", f"port = {ports[0]}\nargs = {{ engine-child = true }}\n"
            )
            layout = layout.replace(
                f"port = {ports[1]}\n",
                f"port = {ports[1]}\nargs = {{ engine-child = true, ignore-term = true }}\n",
            )
            result = daemon.client.apply(layout)
            if not result.get("applied"):
                raise RuntimeError(f"layout refused: {result['errors']}")
            for _ in range(runs):
                daemon.client.action("start", ["e000", "e001"])
                daemon.wait_states({"ready"}, timeout=60)
                time.sleep(0.3)  # the EngineCore child is up too
                stop_ms, gone_ms, n = timed_stop(daemon, "e000")
                out["emulator_stop"].append(stop_ms)
                out["emulator_gone"].append(gone_ms)
                stop_ms, gone_ms, n = timed_stop(daemon, "e001")
                out["ignore_term_stop"].append(stop_ms)
                out["ignore_term_gone"].append(gone_ms)
                print(
                    f"emulator: stop {out['emulator_stop'][-1]:.0f} ms; SIGTERM-deaf: "
                    f"stop {stop_ms:.0f} ms ({n} processes)",
                    flush=True,
                )
        finally:
            daemon.close()
    return out


def vllm_runs(runs: int, token: str) -> dict[str, list[float]]:
    from vsup.demo.tinymodel import generate

    model = generate(MODEL_DIR)
    out: dict[str, list[float]] = {"vllm_stop": [], "vllm_gone": [], "vllm_start": []}
    port = free_ports(1)[0]
    layout = f"""[layout]
name = "stop-vllm"
profiles = ["cpu"]

[defaults]
model = {json.dumps(str(model))}
host = "127.0.0.1"
args = {{ max-model-len = 512 }}
env = {{ {TOKEN_VAR} = "{token}" }}

[[instance]]
name = "vllm"
gpus = []
port = {port}
"""
    with open(VLLM_LOCK, "a") as lock:
        print("waiting for /tmp/vsup-vllm.lock (one real vLLM run at a time)", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        with bench_home() as home:
            daemon = Daemon(home, token)
            try:
                result = daemon.client.apply(layout)
                if not result.get("applied"):
                    raise RuntimeError(f"layout refused: {result['errors']}")
                for i in range(runs):
                    if i:
                        daemon.client.action("start", ["vllm"])
                    t0 = time.monotonic()
                    daemon.wait_states({"ready"}, timeout=300)
                    out["vllm_start"].append(time.monotonic() - t0)
                    stop_ms, gone_ms, n = timed_stop(daemon, "vllm")
                    out["vllm_stop"].append(stop_ms)
                    out["vllm_gone"].append(gone_ms)
                    print(
                        f"vllm: ready after ~{out['vllm_start'][-1]:.0f} s, stop {stop_ms:.0f} "
                        f"ms, last process gone at {gone_ms:.0f} ms ({n} processes)",
                        flush=True,
                    )
            finally:
                daemon.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="emulator runs")
    ap.add_argument("--vllm-runs", type=int, default=3, help="real vLLM runs (each ~30 s)")
    ap.add_argument("--grace", type=float, default=2.0, help="stop_grace_s of the deaf one")
    ap.add_argument("--no-vllm", action="store_true", help="skip the real vLLM")
    args = ap.parse_args(argv)
    token = new_token()
    results: dict[str, list[float]] = {}
    try:
        results |= emulator_runs(args.runs, args.grace, token)
        if not args.no_vllm and args.vllm_runs > 0:
            results |= vllm_runs(args.vllm_runs, token)
    finally:
        left = kill_token(token)
        if left:
            print(f"warning: killed {len(left)} processes left behind: {left}", file=sys.stderr)
    figures: dict[str, object] = {}
    if "vllm_stop" in results:
        figures.update(
            vllm_stop_ms=median(results["vllm_stop"]),
            vllm_gone_ms=median(results["vllm_gone"]),
            vllm_runs=len(results["vllm_stop"]),
        )
    its = median(results["ignore_term_stop"])
    figures.update(
        emulator_stop_ms=median(results["emulator_stop"]),
        ignore_term_stop_ms=its,
        ignore_term_over_grace_ms=its - args.grace * 1e3,
        grace_s=args.grace,
        runs=len(results["ignore_term_stop"]),
    )
    print(last_line(**figures))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
