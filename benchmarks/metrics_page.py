"""What a scrape costs the vLLM server it reads: the whole `/metrics` page against the filtered
one vsup asks for (telemetry/scrape.py: `/metrics/?name[]=...`, only the series it reads).

    python -m benchmarks.metrics_page [--gets N] [--rounds R]

Starts one real CPU vLLM (the generated tiny Llama, one-process mode) on 127.0.0.1, then in R
rounds, turn by turn, N GETs of each page on one kept-alive connection. Per GET: the API
server's CPU (its process's user + system time, psutil) and the wall time. Prints the pages'
sizes, the medians over the rounds and the ratio. vLLM renders the page in its API server, the
process that also takes every request, once a second per scrape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402

from vsup.demo.tinymodel import generate  # noqa: E402
from vsup.telemetry.metrics import SCRAPED_NAMES  # noqa: E402

from benchmarks.common import free_ports  # noqa: E402


def start_vllm(work: Path, port: int) -> subprocess.Popen[bytes]:
    model = generate(work / "tiny-llama")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"]
    argv += ["--enforce-eager", "--dtype", "float32"]
    log = (work / "vllm.log").open("wb")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode} before it served")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"vLLM not ready after {timeout_s:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gets", type=int, default=200, help="GETs of each page per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    query = [("name[]", n) for n in SCRAPED_NAMES]
    with tempfile.TemporaryDirectory(prefix="vsup-bench-") as tmp:
        proc = start_vllm(Path(tmp), port)
        try:
            wait_ready(url, proc)
            api = psutil.Process(proc.pid)
            pages = {
                "whole": lambda c: c.get("/metrics"),
                "filtered": lambda c: c.get("/metrics/", params=query),
            }
            cpu: dict[str, list[float]] = {k: [] for k in pages}
            wall: dict[str, list[float]] = {k: [] for k in pages}
            with httpx.Client(base_url=url, timeout=30) as client:
                sizes = {k: len(get(client).content) for k, get in pages.items()}
                for _ in range(args.rounds):
                    for name, get in pages.items():
                        t = api.cpu_times()
                        c0, w0 = t.user + t.system, time.perf_counter()
                        for _ in range(args.gets):
                            if get(client).status_code != 200:
                                raise SystemExit(f"{name} page: not 200")
                        t = api.cpu_times()
                        cpu[name].append((t.user + t.system - c0) / args.gets * 1e3)
                        wall[name].append((time.perf_counter() - w0) / args.gets * 1e3)
        finally:
            proc.terminate()
            proc.wait(60)
    med = {k: (statistics.median(cpu[k]), statistics.median(wall[k])) for k in pages}
    for k in pages:
        print(
            f"{k:8} {sizes[k]:6d} bytes  API server CPU {med[k][0]:.2f} ms/GET"
            f"  wall {med[k][1]:.2f} ms/GET  rounds {[round(x, 2) for x in cpu[k]]}"
        )
    print(
        f"whole_cpu_ms={med['whole'][0]:.2f} filtered_cpu_ms={med['filtered'][0]:.2f} "
        f"ratio={med['whole'][0] / max(med['filtered'][0], 1e-9):.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
