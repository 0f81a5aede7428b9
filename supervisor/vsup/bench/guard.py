"""What a command that replaces the running layout for a while needs so that the layout comes
back whatever ends it: `vsup bench` uses it, and `vsup tune` (built on the bench) will.

`LayoutGuard` (a context manager, entered before the command talks to the daemon at all):
- SIGINT, SIGTERM and SIGHUP (an SSH session that drops) interrupt the command: they raise
  `Interrupted` (a KeyboardInterrupt) in the main thread, and the command restores the original
  layout on its way out. While the restore runs (`restoring`), a further signal only says to
  wait, and in a `deferred()` block (starting children) it waits for the block's end. A SIGHUP
  the command was started with ignored (`nohup vsup bench ...`) stays ignored:
  the bench then survives its terminal and runs to its end.
- Output never ends the command: after a hang-up the terminal refuses writes (EIO) and a pipe
  whose reader left refuses them too (EPIPE); stdout and stderr are wrapped so that such a
  write is dropped instead of raising in the middle of a restore. What the command says also
  goes to a log file of its own once it names one (`log_to`).
- `claim(...)`, before the first apply, writes the layout lease (vsup/lease.py): a command
  killed with SIGKILL (which no handler sees) leaves it, and the daemon shows it as advice
  until `vsup bench --restore` puts the original back. `release()` removes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from vsup.lease import Lease, clear_lease, layout_sha, my_start_ticks, write_lease

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WHY: dict[int, str] = {
    signal.SIGINT: "interrupted (Ctrl-C)",
    signal.SIGTERM: "interrupted (SIGTERM)",
    signal.SIGHUP: "interrupted (SIGHUP: the terminal went away)",
}


class Interrupted(KeyboardInterrupt):
    """A signal asked the command to stop; `why` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(WHY.get(signum, f"interrupted (signal {signum})"))
        self.signum = signum
        self.why = str(self)


class ResilientStream:
    """A text stream whose writes never raise: once the terminal or pipe behind it refuses a
    write, the rest is dropped (and it stops claiming to be a terminal). Everything written
    also goes to `copy` when set."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False
        self.copy: TextIO | None = None
        self.encoding = getattr(stream, "encoding", "utf-8")

    def write(self, text: str) -> int:
        if self.copy is not None:
            with contextlib.suppress(OSError, ValueError):
                self.copy.write(text)
                self.copy.flush()
        if not self.broken:
            try:
                self.stream.write(text)
            except (OSError, ValueError):
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        if self.broken:
            return False
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()


class LayoutGuard:
    """Signals, output and the layout lease of a command that replaces the running layout
    (see the module doc). `busy()` says whether a restore runs (signals then only warn)."""

    def __init__(
        self,
        home: Path,
        owner: str = "bench",
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.home = Path(home)
        self.owner = owner
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.restoring = False
        self.signum: int | None = None  # the signal that interrupted, if one did
        self.claimed = False
        self._deferring = False
        self._pending: int | None = None
        self._old: dict[int, Any] = {}
        self._streams: tuple[TextIO, TextIO] | None = None
        self._log: TextIO | None = None

    # ------------------------------------------------------------------ context

    def __enter__(self) -> LayoutGuard:
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = ResilientStream(sys.stdout)
        sys.stderr = ResilientStream(sys.stderr)
        for sig in SIGNALS:
            old = signal.getsignal(sig)
            if sig == signal.SIGHUP and old == signal.SIG_IGN:
                continue  # started under nohup: survive the terminal, as asked
            self._old[sig] = old
            signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        if self._streams is not None:
            for s in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    s.flush()
            sys.stdout, sys.stderr = self._streams
            self._streams = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.restoring:
            self.say("the original layout is being restored; wait for it")
            return
        self.signum = signum
        if self._deferring:
            self._pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals during the block take effect at its end: a child being started (its Popen
        half done) is recorded, so the restore can stop it, before the interrupt."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        pending, self._pending = self._pending, None
        if pending is not None and not self.restoring:
            raise Interrupted(pending)

    @contextlib.contextmanager
    def restore_phase(self) -> Iterator[None]:
        """Signals during the block only say to wait: a restore must finish."""
        self.restoring = True
        try:
            yield
        finally:
            self.restoring = False

    def log_to(self, path: Path) -> None:
        """Copy everything written to stdout and stderr from now on to `path` (appended)."""
        try:
            self._log = open(path, "a", encoding="utf-8")
        except OSError:
            return
        for s in (sys.stdout, sys.stderr):
            if isinstance(s, ResilientStream):
                s.copy = self._log

    # ------------------------------------------------------------------ the lease

    def claim(self, original: dict[str, Any], layouts: list[tuple[str, str]]) -> None:
        """Write the lease: what ran before (`original`: toml, path, name, serving, idle,
        daemon_was_running) and the (name, toml) of every layout this command may apply."""
        lease = Lease(
            owner=self.owner,
            pid=_pid(),
            start_ticks=my_start_ticks(),
            started_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            original=original,
            layouts=[{"name": name, "sha256": layout_sha(toml)} for name, toml in layouts],
        )
        write_lease(self.home, lease)
        self.claimed = True

    def release(self) -> None:
        """Remove this command's lease (the original layout is back, or kept on purpose)."""
        if self.claimed:
            clear_lease(self.home, pid=_pid())
            self.claimed = False


def _pid() -> int:
    return os.getpid()
