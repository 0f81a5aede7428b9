#!/usr/bin/env python3
"""A vLLM *emulator*: a stand-in that behaves like a vLLM server where it matters to vsup.

It is not vLLM and never pretends to be in results: benchmarks and GPU checks that use it say
"emulator". It exists for what real engines cannot do here: 64 endpoints on a 2-core machine,
start-up times set to the second, and GPU runs on a machine where vLLM cannot be installed.

What it does, like `vllm serve`:
- accepts vLLM's command line (unknown flags are ignored), `--host`, `--port`;
- after `--startup-s` seconds, listens and answers `GET /health` 200, `GET /metrics` with a
  recorded vLLM payload whose values move (KV usage, running/waiting, token and preemption
  counters), `GET /version`, `GET /v1/models`;
- logs vLLM's start-up lines (attention backend, "Starting vLLM server on ...",
  "Application startup complete.");
- with `--hbm-gib G` allocates G GiB on its GPU (torch, CUDA_VISIBLE_DEVICES) and with
  `--child-hbm-gib C` starts a child process (as EngineCore does) holding C GiB more, in the same
  process group; SIGTERM stops both (~at once), SIGKILL of the parent leaves the child alive and
  holding its memory, as SIGKILL does to a real vLLM API server;
- `--ports A-B` serves many emulated endpoints from one process (the overhead benchmark).
Stdlib only (plus torch when asked for HBM), so it runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PAYLOAD = HERE.parent / "fixtures" / "vllm-0.32-cpu" / "metrics_idle.txt"

# Families whose value moves with time: name -> function(t, state) -> float.
_MOVING = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


class Payload:
    """A recorded /metrics payload with the moving families' values re-rendered per scrape."""

    def __init__(self, text: str, model: str) -> None:
        recorded = re.search(r'model_name="([^"]*)"', text)
        if recorded:
            text = text.replace(f'model_name="{recorded.group(1)}"', f'model_name="{model}"')
        self.slots: list[str] = []
        line_re = re.compile(
            r"^(" + "|".join(re.escape(n) for n in _MOVING) + r")(\{[^}]*\})? (\S+)$", re.M
        )
        pos = 0
        chunks: list[str] = []
        for m in line_re.finditer(text):
            chunks.append(text[pos : m.start(3)])
            self.slots.append(m.group(1))
            pos = m.end(3)
        chunks.append(text[pos:])
        self.chunks = chunks
        self.t0 = time.monotonic()
        self.model = model

    def render(self) -> bytes:
        t = time.monotonic() - self.t0
        values = {
            "vllm:kv_cache_usage_perc": 0.5 + 0.45 * math.sin(t / 7.0),
            "vllm:num_requests_running": float(int(4 + 3 * math.sin(t / 5.0))),
            "vllm:num_requests_waiting": float(int(max(0.0, 6 * math.sin(t / 9.0)))),
            "vllm:num_preemptions_total": float(int(t / 3.0)),
            "vllm:prompt_tokens_total": float(int(t * 250.0)),
            "vllm:generation_tokens_total": float(int(t * 900.0)),
        }
        out = [self.chunks[0]]
        for slot, chunk in zip(self.slots, self.chunks[1:]):
            out.append(repr(values[slot]))
            out.append(chunk)
        return "".join(out).encode()


class Server:
    def __init__(self, payload: Payload, model: str) -> None:
        self.payload = payload
        self.model = model

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
                parts = request_line.split(" ")
                path = parts[1] if len(parts) > 1 else "/"
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                status, ctype, body = self.route(path.split("?", 1)[0])
                writer.write(
                    f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\n"
                    f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/health":
            return "200 OK", "application/json", b""
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4; charset=utf-8", self.payload.render()
        if path == "/version":
            return "200 OK", "application/json", b'{"version":"0.32.0-emulator"}'
        if path == "/v1/models":
            body = '{"object":"list","data":[{"id":"%s","object":"model","max_model_len":512}]}'
            return "200 OK", "application/json", (body % self.model).encode()
        return "404 Not Found", "application/json", b'{"detail":"Not Found"}'


def _hold_hbm(gib: float) -> object | None:
    if gib <= 0:
        return None
    import torch

    return torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")


def _child_main(gib: float) -> None:
    """The EngineCore stand-in: hold memory until told to stop (or forever, once orphaned)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    held = _hold_hbm(gib)
    print(f"(EngineCore pid={os.getpid()}) holding {gib} GiB", flush=True)
    while True:
        time.sleep(3600)
    del held


def _ports(spec: str | None, port: int) -> list[int]:
    if not spec:
        return [port]
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


async def _serve(args: argparse.Namespace) -> None:
    text = Path(args.metrics_file).read_text()
    servers = []
    for port in _ports(args.ports, args.port):
        srv = Server(Payload(text, args.model), args.model)
        servers.append(await asyncio.start_server(srv.handle, args.host, port))
    print(f"(APIServer pid={os.getpid()}) INFO Starting vLLM server on http://{args.host}:{args.port}")
    print("INFO:     Application startup complete.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="vLLM emulator (not vLLM)")
    p.add_argument("--model", default="emulated-model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ports", help="serve every port in A-B from this one process")
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--hbm-gib", type=float, default=0.0)
    p.add_argument("--child-hbm-gib", type=float, default=0.0)
    p.add_argument("--metrics-file", default=str(DEFAULT_PAYLOAD))
    p.add_argument("--backend-line", default="Using FLASH_ATTN attention backend out of "
                   "potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']")
    p.add_argument("--exit-after-s", type=float, default=0.0, help="crash on purpose (code 1)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, _unknown = p.parse_known_args(argv)
    if args.child:
        _child_main(args.child_hbm_gib)
        return 0
    print(f"(APIServer pid={os.getpid()}) INFO vLLM emulator (not vLLM) for model {args.model}",
          flush=True)
    child = None
    if args.child_hbm_gib > 0:
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", "--child-hbm-gib", str(args.child_hbm_gib)]
        )
    held = _hold_hbm(args.hbm_gib)
    if args.startup_s:
        time.sleep(args.startup_s)
    print(f"(EngineCore pid={child.pid if child else os.getpid()}) INFO {args.backend_line}",
          flush=True)
    try:
        if args.exit_after_s:
            async def crash() -> None:
                await asyncio.sleep(args.exit_after_s)
                print("ERROR EngineCore encountered an issue (emulated crash)", flush=True)
                os._exit(1)

            async def both() -> None:
                await asyncio.gather(_serve(args), crash())

            asyncio.run(both())
        else:
            asyncio.run(_serve(args))
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)
        del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
