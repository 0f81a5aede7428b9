"""Following a vLLM log file as it grows: the tail for exit classification, the attention
backend line, the platform, the memory lines (memprofile.py) and the readiness lines.

`LogWatcher.poll()` reads the bytes appended since the last call (at most `max_read` of them,
so a burst never stalls the caller; the next poll continues), from a regular file, without
blocking on anything but the disk. It is meant to run in a worker thread
(`await asyncio.to_thread(watcher.poll)`) or, with a small `max_read`, inline. A line is only
processed once its newline arrived; a file that shrank (truncated or replaced) is re-read from
its start; a part released past the run log's cap (a hole, engine/runlog.py) is skipped, and
reading resumes at the next whole line after it.

Readiness lines (a hint; `/health` decides): `Starting vLLM server on http://HOST:PORT` (0.32),
`Starting vLLM API server on http://HOST:PORT` (older), then uvicorn's
`Application startup complete.`
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from vsup.fsutil import data_from, hole_from
from vsup.logtext import render_line
from vsup.telemetry.backend import BackendDetector, BackendInfo
from vsup.telemetry.memprofile import MemoryLines

DEFAULT_TAIL_LINES = 200
MAX_LINE_CHARS = 4096  # vLLM's engine-config line is ~4 KB; longer lines are cut
DEFAULT_MAX_READ = 1 << 20

_SERVER_ON = re.compile(r"Starting vLLM (?:API )?server on (\S+)")
_STARTUP_COMPLETE = "Application startup complete."


@dataclass(frozen=True)
class LogUpdate:
    """What one poll found."""

    new_lines: tuple[str, ...]
    bytes_read: int
    offset: int  # where the next poll starts
    restarted: bool = False  # the file shrank and was read again from its start


class LogWatcher:
    """Incremental reader of one log file (one run of one instance)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        offset: int = 0,
        tail_lines: int = DEFAULT_TAIL_LINES,
        max_read: int = DEFAULT_MAX_READ,
    ) -> None:
        self.path = Path(path)
        self.offset = offset
        self.max_read = max_read
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._partial = b""
        self._resync = False  # skip to the next line start (after a released part)
        self.backend = BackendDetector()
        self.memory = MemoryLines()
        self.listen_url: str | None = None  # from "Starting vLLM (API )server on URL"
        self.server_line: str | None = None
        self.startup_complete = False

    @property
    def platform(self) -> str | None:
        return self.backend.platform

    @property
    def ready_logged(self) -> bool:
        """The log says the HTTP server is up (both readiness lines seen)."""
        return self.listen_url is not None and self.startup_complete

    def backend_info(self, flag: object = None, platform: str | None = None) -> BackendInfo | None:
        """The backend to report (see backend.resolve_backend): the log's, else `flag`'s,
        else the platform default."""
        return self.backend.result(flag, platform)

    def tail_text(self, lines: int | None = None) -> str:
        """The last `lines` complete lines (all kept ones by default), newline-joined."""
        kept = list(self.tail)
        if lines is not None:
            kept = kept[-lines:] if lines > 0 else []
        return "\n".join(kept)

    def poll(self) -> LogUpdate:
        """Read what was appended since the last poll. A missing file reads as nothing new."""
        try:
            # the daemon asks every instance's log each poll, and most have written nothing:
            # one stat answers that, without opening the file (docs/benchmarks.md, 2026-12-06)
            if os.stat(self.path).st_size == self.offset:
                return LogUpdate((), 0, self.offset, False)
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                restarted = False
                if size < self.offset:
                    self.offset = 0
                    self._partial, self._resync = b"", False
                    restarted = True
                if size == self.offset:
                    return LogUpdate((), 0, self.offset, restarted)
                fd = f.fileno()
                at = data_from(fd, self.offset)
                if at > self.offset:
                    # released past the cap: what was half read before it never ends
                    self.offset, self._partial, self._resync = at, b"", True
                end = min(size, hole_from(fd, self.offset), self.offset + self.max_read)
                f.seek(self.offset)
                data = f.read(max(0, end - self.offset))
        except FileNotFoundError:
            return LogUpdate((), 0, self.offset)
        self.offset += len(data)
        chunk = self._partial + data
        if self._resync:
            nl = chunk.find(b"\n")
            if nl < 0:
                return LogUpdate((), len(data), self.offset, restarted)
            chunk, self._resync = chunk[nl + 1 :], False
        parts = chunk.split(b"\n")
        self._partial = parts.pop()
        # A partial line never grows without bound: past the cap it is cut and kept as a line.
        if len(self._partial) > MAX_LINE_CHARS * 4:
            parts.append(self._partial)
            self._partial = b""
        lines = tuple(self._take(p) for p in parts)
        return LogUpdate(lines, len(data), self.offset, restarted)

    def _take(self, raw: bytes) -> str:
        # Progress bars redraw with carriage returns: keep what a terminal would show.
        text = render_line(raw.decode("utf-8", errors="replace"))
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + "..."
        self.tail.append(text)
        self._detect(text)
        return text

    def _detect(self, line: str) -> None:
        self.backend.feed(line)
        self.memory.feed(line)
        if self.listen_url is None and "Starting vLLM" in line:
            m = _SERVER_ON.search(line)
            if m:
                self.listen_url = m.group(1)
                self.server_line = line
        if not self.startup_complete and _STARTUP_COMPLETE in line:
            self.startup_complete = True


def scan_log(path: str | os.PathLike[str], tail_lines: int = DEFAULT_TAIL_LINES) -> LogWatcher:
    """Read a whole (finished or growing) log once; the watcher holds what was found."""
    watcher = LogWatcher(path, tail_lines=tail_lines)
    while watcher.poll().bytes_read:
        pass
    return watcher
