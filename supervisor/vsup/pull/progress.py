"""A pull's progress: bytes per file and in total, rates over the last seconds, ETAs.

huggingface_hub reports a download through the progress-bar class it is given
(`hf_hub_download(tqdm_class=...)`): it makes one bar per file transfer and calls `update(n)`
for each chunk written (`update(-n)` when a server ignored a Range request and the file starts
over), `update_transfer(n)` for bytes that came over the network (the same bytes over HTTP; Xet
tells the two apart: vsup counts file bytes). `PullProgress.bar_class(name)` is such a class
bound to one file; it is also where a cancelled pull stops: the next `update` raises
`PullCancelled`, which huggingface_hub does not retry, so the download ends and removes its
temporary file.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vsup.pull.errors import PullCancelled
from vsup.pull.selection import RepoFile
from vsup.states import FileState

RATE_WINDOW_S = 5.0
FILE_STATES = tuple(s.value for s in FileState)


@dataclass(frozen=True)
class FileProgress:
    name: str
    size: int | None
    done: int  # bytes of it on disk (or in its temporary file)
    state: str  # FILE_STATES
    rate_bps: float | None
    eta_s: float | None


@dataclass(frozen=True)
class ProgressReport:
    """One reading of a pull's progress (what the worker sends, the CLI and status show)."""

    files: tuple[FileProgress, ...]
    bytes_done: int  # of the selected files' bytes, in the cache already or fetched since
    bytes_total: int
    fetched_bytes: int  # over the network by this pull
    rate_bps: float | None
    eta_s: float | None
    elapsed_s: float

    @property
    def files_done(self) -> int:
        return sum(1 for f in self.files if f.state in (FileState.DONE, FileState.CACHED))

    @property
    def files_total(self) -> int:
        return len(self.files)

    @property
    def fetching(self) -> tuple[FileProgress, ...]:
        return tuple(f for f in self.files if f.state == FileState.FETCHING)

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "fetched_bytes": self.fetched_bytes,
            "rate_bps": _round(self.rate_bps),
            "eta_s": _round(self.eta_s),
            "elapsed_s": round(self.elapsed_s, 1),
            "files_done": self.files_done,
            "files_total": self.files_total,
            "files": [
                {
                    "name": f.name,
                    "size": f.size,
                    "done": f.done,
                    "state": f.state,
                    "rate_bps": _round(f.rate_bps),
                    "eta_s": _round(f.eta_s),
                }
                for f in self.files
            ],
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


@dataclass
class _File:
    name: str
    size: int | None
    done: int = 0
    state: str = "waiting"
    samples: deque[tuple[float, int]] = field(default_factory=deque)


class _Rate:
    """Bytes per second over the last RATE_WINDOW_S seconds of (time, counter) samples."""

    @staticmethod
    def add(samples: deque[tuple[float, int]], now: float, value: int) -> None:
        samples.append((now, value))
        while len(samples) > 2 and now - samples[1][0] > RATE_WINDOW_S:
            samples.popleft()

    @staticmethod
    def of(samples: deque[tuple[float, int]], now: float) -> float | None:
        if len(samples) < 2:
            return None
        t0, v0 = samples[0]
        span = now - t0
        if span <= 0.2:
            return None
        return max(0.0, (samples[-1][1] - v0) / span)


class PullProgress:
    """Progress of one pull, updated from download threads, read from any thread."""

    def __init__(
        self,
        files: Sequence[RepoFile],
        cached: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        cancel: threading.Event | None = None,
    ) -> None:
        self.clock = clock
        self.cancel = cancel or threading.Event()
        self._lock = threading.Lock()
        self._files = {f.name: _File(f.name, f.size) for f in files}
        for name in cached:
            if name in self._files:
                f = self._files[name]
                f.state, f.done = "cached", f.size or 0
        self._fetched = 0
        self._total_samples: deque[tuple[float, int]] = deque()
        self._started = clock()

    # -- fed by the downloads ------------------------------------------------------------

    def started(self, name: str) -> None:
        with self._lock:
            f = self._files[name]
            f.state, f.done = "fetching", 0
            f.samples.clear()
            _Rate.add(f.samples, self.clock(), 0)

    def advance(self, name: str, n: int, transfer: bool = True) -> None:
        """`n` more bytes of `name` written (negative: a download that started over);
        `transfer` False for bytes that were on disk already (a resumed file)."""
        if self.cancel.is_set():
            raise PullCancelled()
        with self._lock:
            now = self.clock()
            f = self._files[name]
            f.done = max(0, f.done + n)
            if transfer and n > 0:
                self._fetched += n
            _Rate.add(f.samples, now, f.done)
            _Rate.add(self._total_samples, now, self._fetched)

    def finished(self, name: str, fetched: bool = True) -> None:
        with self._lock:
            f = self._files[name]
            f.state = "done" if fetched else "cached"
            if f.size is not None:
                f.done = f.size

    def failed(self, name: str) -> None:
        with self._lock:
            self._files[name].state = "failed"

    def bar_class(self, name: str) -> type:
        """A tqdm-like class for huggingface_hub, bound to file `name`."""
        progress = self

        class FileBar:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.total = kwargs.get("total")
                self.n = int(kwargs.get("initial") or 0)
                self.disable = False
                # an `initial` is bytes a resumed download already had (huggingface_hub < 2)
                if self.n:
                    progress.advance(name, self.n, transfer=False)

            def update(self, n: float | None = 1) -> None:
                step = int(n or 0)
                self.n += step
                progress.advance(name, step)

            def update_transfer(self, n: float | None = 1) -> None:
                # Xet's network bytes beside its file bytes (HTTP calls it with the same bytes
                # as `update`): the file bytes are what this pull counts
                return None

            def refresh(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_description(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def close(self) -> None:
                return None

            def reset(self, total: int | None = None) -> None:
                self.total = total

            def __enter__(self) -> FileBar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        return FileBar

    # -- read ------------------------------------------------------------------------------

    def report(self) -> ProgressReport:
        with self._lock:
            now = self.clock()
            files = []
            for f in self._files.values():
                rate = _Rate.of(f.samples, now) if f.state == FileState.FETCHING else None
                eta = None
                if rate and f.size is not None:
                    eta = max(0.0, (f.size - f.done) / rate)
                files.append(FileProgress(f.name, f.size, f.done, f.state, rate, eta))
            total = sum(f.size or 0 for f in self._files.values())
            done = sum(min(f.done, f.size) if f.size is not None else f.done for f in files)
            rate = _Rate.of(self._total_samples, now)
            eta = max(0.0, (total - done) / rate) if rate else None
            if done >= total:
                eta = 0.0
            return ProgressReport(
                tuple(files), done, total, self._fetched, rate, eta, now - self._started
            )
