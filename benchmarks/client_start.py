"""What a bench/tune step saves by running its vLLM client in a kept process.

    python -m benchmarks.client_start [--runs 3]

Each `vsup bench` layout and each `vsup tune` step runs vLLM's bench client once per instance.
A fresh client process (`python -c BOOTSTRAP FLAGS`, vsup/bench/client.py) imports vLLM and
parses its flags before its barrier; a kept one (`ClientPool`) is at the barrier already, and
its next run costs a parse of the run's flags (`go [...]`). Measured with the vLLM of this
Python (the CPU build here), no server needed:
- `fresh`: start the bootstrap, wait for its ready line; the process's CPU (user + system,
  psutil) and wall time at that line. Median over `--runs` processes.
- `reused`: in one kept process, `go` with flags the parser refuses, until its done line (the
  bootstrap's loop with the parse and the heap clean-up, without a server to load); the CPU
  the process spent on it and the wall time. Median over `--runs` rounds.

Last line: `fresh_cpu_s=.. fresh_wall_s=.. reused_cpu_s=.. reused_wall_s=.. vllm=..`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from vsup.bench.client import BOOTSTRAP, DONE, READY  # noqa: E402

from benchmarks.common import last_line, median  # noqa: E402

FLAGS = ["--backend", "vllm", "--base-url", "http://127.0.0.1:9", "--model", "m"]


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def start() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, *FLAGS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY):
            return proc, line
    raise SystemExit(f"the bootstrap ended before its ready line: {proc.wait()}")


def until_done(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(DONE):
            return line
    raise SystemExit("the bootstrap ended before its done line")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    fresh_cpu, fresh_wall, version = [], [], "?"
    for _ in range(a.runs):
        t0 = time.monotonic()
        proc, line = start()
        fresh_wall.append(time.monotonic() - t0)
        fresh_cpu.append(cpu(psutil.Process(proc.pid)))
        version = line.split()[1]
        assert line.split()[2] == "loop", line
        proc.kill()
        proc.wait()
    proc, _ = start()
    p = psutil.Process(proc.pid)
    reused_cpu, reused_wall = [], []
    assert proc.stdin is not None
    for _ in range(a.runs):
        c0, t0 = cpu(p), time.monotonic()
        proc.stdin.write("go " + json.dumps([*FLAGS, "--no-such-flag"]) + "\n")
        proc.stdin.flush()
        assert until_done(proc).split()[1] == "2"
        reused_wall.append(time.monotonic() - t0)
        reused_cpu.append(cpu(p) - c0)
    proc.stdin.close()
    assert proc.wait(30) == 0
    print(json.dumps({"fresh_cpu_s": fresh_cpu, "fresh_wall_s": fresh_wall,
                      "reused_cpu_s": reused_cpu, "reused_wall_s": reused_wall}))  # fmt: skip
    print(
        last_line(
            fresh_cpu_s=round(median(fresh_cpu), 2),
            fresh_wall_s=round(median(fresh_wall), 2),
            reused_cpu_s=round(median(reused_cpu), 3),
            reused_wall_s=round(median(reused_wall), 3),
            vllm=version,
        )
    )


if __name__ == "__main__":
    main()
