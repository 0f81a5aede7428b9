"""A webhook receiver on 127.0.0.1 for the alert tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A webhook receiver on 127.0.0.1: records JSON bodies, answers scripted statuses."""

    def __init__(
        self,
        statuses: list[int] | None = None,
        delay_s: float = 0.0,
        gate: threading.Event | None = None,
    ) -> None:
        """`gate`: when given, each request is held (read, not answered) until it is set;
        `arrived` counts the requests read so far."""
        self.bodies: list[dict] = []
        self.statuses = list(statuses or [])
        self.delay_s = delay_s
        self.gate = gate
        self.arrived = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrived += 1
                if receiver.gate is not None:
                    receiver.gate.wait()
                time.sleep(receiver.delay_s)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status < 300:
                    receiver.bodies.append(json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def texts(self) -> list[str]:
        return [b["text"] for b in self.bodies]
