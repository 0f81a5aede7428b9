"""Capture what a data-parallel vLLM server looks like to vsup, and what one dead rank does.

Starts `vllm serve`-equivalent (`python -m vllm.entrypoints.openai.api_server`) with
`--data-parallel-size N` on a local model, waits for /health 200, records the process tree
(pid, ppid, pgid, process title), the GPU driver's per-process memory list for every GPU (NVML's
`nvmlDeviceGetComputeRunningProcesses` as pynvml returns it, when pynvml and a GPU are there),
then SIGKILLs one rank's `VLLM::EngineCore_DP{r}` and records /health each 0.1 s until the API
server exits, and what is left of its process group. The results are the facts behind
docs/layout.md ("What a dead rank means") and the DP fixtures in tests/fixtures.

    python benchmarks/dp_capture.py --model DIR --dp 2 --kill-rank 1 --out /tmp/dpcap \
        [--port 18790] [--extra "--enforce-eager --dtype float32"]

Writes OUT/server.log (stdout+stderr of the server) and OUT/capture.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def tree(pgid: int) -> list[dict]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2 :].split()
        if int(rest[2]) == pgid:
            pid = int(entry)
            out.append(
                {"pid": pid, "ppid": int(rest[1]), "state": rest[0].decode(), "title": title(pid)}
            )
    return sorted(out, key=lambda p: p["pid"])


def nvml_processes() -> list[dict] | None:
    """Per GPU, the compute processes exactly as pynvml returns them (the fields it fills)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [{"error": str(exc)}]
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            gpus.append(
                {
                    "index": i,
                    "used": mem.used,
                    "total": mem.total,
                    "processes": [
                        {
                            "pid": p.pid,
                            "usedGpuMemory": p.usedGpuMemory,
                            "gpuInstanceId": getattr(p, "gpuInstanceId", None),
                            "computeInstanceId": getattr(p, "computeInstanceId", None),
                        }
                        for p in procs
                    ],
                }
            )
    finally:
        pynvml.nvmlShutdown()
    return gpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--port", type=int, default=18790)
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra", default="", help="more server flags, one string")
    ap.add_argument("--ready-timeout", type=float, default=400)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--data-parallel-size",
        str(args.dp),
        "--disable-uvicorn-access-log",
        *shlex.split(args.extra),
    ]
    record: dict = {"argv": argv[1:]}
    with open(out / "server.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            t0 = time.monotonic()
            while health(args.port) != 200:
                if proc.poll() is not None:
                    record["early_exit"] = proc.returncode
                    break
                if time.monotonic() - t0 > args.ready_timeout:
                    record["ready_timeout"] = True
                    break
                time.sleep(0.5)
            else:
                record["ready_s"] = round(time.monotonic() - t0, 1)
            if "ready_s" in record:
                time.sleep(2)  # let the driver list every process
                record["tree"] = tree(proc.pid)
                record["gpus"] = nvml_processes()
                victim = next(
                    (
                        p["pid"]
                        for p in record["tree"]
                        if p["title"].endswith(f"::EngineCore_DP{args.kill_rank}")
                    ),
                    None,
                )
                record["victim"] = victim
                if victim is not None:
                    t1 = time.monotonic()
                    os.kill(victim, signal.SIGKILL)
                    timeline, last = [], object()
                    while proc.poll() is None and time.monotonic() - t1 < 60:
                        h = health(args.port)
                        if h != last:
                            timeline.append([round(time.monotonic() - t1, 2), h])
                            last = h
                        time.sleep(0.1)
                    record["health_after_kill"] = timeline
                    record["exit_after_s"] = round(time.monotonic() - t1, 2)
                    record["exit_code"] = proc.poll()
                    record["left_in_group"] = tree(proc.pid)
                    record["gpus_after"] = nvml_processes()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    (out / "capture.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
