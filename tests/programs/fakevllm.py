"""A stand-in for a vLLM API server, for engine tests that need real processes but not a model.

It takes vLLM's `--model/--host/--port` (and ignores other flags), answers `GET /health` once
"ready", and can reproduce the behaviours the engine must handle:
  --ready-after S        listen only after S seconds (vLLM refuses connections until ready)
  --engine-child         start an "EngineCore" child in the same process group; like vLLM's,
                         it survives a SIGKILL of this process (re-parented to PID 1)
  --setsid-child         start a child that moves to its own session (leaves the group)
  --ignore-term          ignore SIGTERM (the engine must SIGKILL after the grace period)
  --exit-after S         exit by itself S seconds after start, with --exit-code N
  --say LINE             print LINE at start (to put real vLLM log lines in the run log)
  --dead-exit-after S    when the EngineCore child dies: /health answers 503, the vLLM
                         EngineDeadError line is printed, and it exits 0 after S seconds
Every process prints `fakevllm <role> pid=<pid> pgid=<pgid> prefix=<sys.prefix>`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENGINE_DEAD = (
    "(APIServer pid={pid}) ERROR 01-01 00:00:00 [async_llm.py:906] "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


def hello(role: str) -> None:
    print(f"fakevllm {role} pid={os.getpid()} pgid={os.getpgid(0)} prefix={sys.prefix}", flush=True)


def child(role: str) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if role == "setsid":
        os.setsid()
    hello(role)
    while True:
        time.sleep(3600)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--engine-child", action="store_true")
    p.add_argument("--setsid-child", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--exit-after", type=float)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--say", action="append", default=[])
    p.add_argument("--dead-exit-after", type=float)
    args, _unknown = p.parse_known_args()

    hello("server")
    for line in args.say:
        print(line, flush=True)
    me = [sys.executable, os.path.abspath(__file__)]
    core = subprocess.Popen([*me, "--child", "core"]) if args.engine_child else None
    if args.setsid_child:
        subprocess.Popen([*me, "--child", "setsid"])
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_after is not None:
        threading.Timer(args.exit_after, lambda: os._exit(args.exit_code)).start()

    status = {"code": 200}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = status["code"] if self.path == "/health" else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a) -> None:
            pass

    if core is not None and args.dead_exit_after is not None:

        def watch_core() -> None:
            core.wait()
            status["code"] = 503
            print(ENGINE_DEAD.format(pid=os.getpid()), flush=True)
            time.sleep(args.dead_exit_after)
            os._exit(0)

        threading.Thread(target=watch_core, daemon=True).start()

    time.sleep(args.ready_after)
    server = ThreadingHTTPServer((args.host, args.port), Health)
    print(f"Starting vLLM server on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2]))
    sys.exit(main())
