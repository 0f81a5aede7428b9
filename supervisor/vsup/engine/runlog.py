"""Per-run log files: `logs_dir/NAME/run-NNNN.log`, one per spawn, stdout and stderr together.

The child writes its file directly (opened O_APPEND), never through a pipe to the daemon: an
instance must outlive the daemon and keep logging while no daemon runs.

Limits, so 64 instances that crash-loop or log every request cannot fill the disk:
- only the last `keep` runs of an instance are kept (default 5); older run files are deleted
  when a new run starts;
- a live run holds at most `max_bytes` on disk (default 32 MiB), whether a daemon runs or not:
  each run has a log guard, a small process of its own that outlives the daemon and ends with
  the run (logcap.py: started at spawn, and by the engine's chores for a run that has none).
  Past the cap it releases the middle of the file with `fallocate(PUNCH_HOLE)`: the start of
  the run (`head_bytes`, vLLM's start-up lines) and its latest part stay, the child's O_APPEND
  writes go on at the end, and no line is lost or moved. Offsets never change, so a reader that
  follows the file by offset (`vsup logs -f`, the log watcher, the dashboard) stays correct:
  the released part reads as a hole, which readers skip (`fsutil.data_from`) saying how much
  was released. On disk a run holds at most max_bytes + `step_bytes` + what the server writes
  between two checks (30 MB/s of output: about 3 MB, checked every 0.1 s); a run's apparent
  size (`ls -l`) keeps growing, its disk use (`du`) does not;
- where the file system cannot punch holes (or for caps under `PUNCH_MIN_BYTES`) and once a
  file's apparent size passes `RESET_BYTES` (so it never nears a file-size limit), the live
  file is copied to `run-NNNN.log.1` (replacing the previous copy) and truncated to zero
  instead: lines written between the copy and the truncation are lost, a marker line says
  where the older part went, and readers see the file shrink and start it again. A run then
  holds about 2 x max_bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO

from vsup.engine import logcap

_RUN_FILE = re.compile(r"^run-(\d+)\.log(\.1)?$")

DEFAULT_KEEP = 5
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
TAIL_BYTES = 64 * 1024


class RunLogs:
    """The run log files of one instance."""

    def __init__(
        self,
        logs_dir: Path,
        name: str,
        keep: int = DEFAULT_KEEP,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.dir = Path(logs_dir) / name
        self.keep = max(1, keep)
        self.max_bytes = max_bytes
        self._last: tuple[int, Path] | None = None  # the daemon asks the latest run's each poll

    def path(self, run: int) -> Path:
        last = self._last
        if last is None or last[0] != run:
            last = self._last = (run, self.dir / f"run-{run:04d}.log")
        return last[1]

    def runs(self) -> list[int]:
        """Run numbers that have a log file, oldest first."""
        if not self.dir.is_dir():
            return []
        found = set()
        for entry in os.listdir(self.dir):
            m = _RUN_FILE.match(entry)
            if m and not m.group(2):
                found.add(int(m.group(1)))
        return sorted(found)

    def open_for_run(self, run: int, header: str) -> BinaryIO:
        """Create run `run`'s file (append mode, 0600) with a header line, after deleting the
        runs that fall out of the last `keep`. The caller hands it to the child and closes it."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for old in self.runs():
            if old <= run - self.keep:
                for p in (self.path(old), self._older_part(old)):
                    p.unlink(missing_ok=True)
        fd = os.open(self.path(run), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        f = os.fdopen(fd, "ab", buffering=0)
        try:
            f.write(header.rstrip("\n").encode() + b"\n")
        except OSError:
            # A full disk: vLLM dies on its first stderr write that fails (tqdm), so this run
            # writes to /dev/null and serves; the daemon's disk alert says why logs are missing.
            f.close()
            return open(os.devnull, "ab", buffering=0)
        return f

    def note(self, run: int, line: str) -> None:
        """Append a `[vsup]` line to run `run`'s file (what vsup did to the run, e.g. a signal
        and why). O_APPEND, like the child's writes: lines never interleave mid-line. A run
        without a file, or a full disk, loses the line, never the caller's work."""
        path = self.path(run)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError:
            return
        try:
            os.write(fd, f"[vsup] {line}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    @property
    def head_bytes(self) -> int:
        """The start of a run kept when its middle is released."""
        return logcap.head_bytes(self.max_bytes)

    @property
    def step_bytes(self) -> int:
        """How far past the cap a run may grow before the next release (fewer, larger ones)."""
        return logcap.step_bytes(self.max_bytes)

    def cap(self, run: int) -> bool:
        """Keep run `run`'s live file under `max_bytes` now (what its guard does every check);
        True if it cut or released part of it."""
        try:
            return logcap.cap_file(str(self.path(run)), self.max_bytes)
        except FileNotFoundError:
            return False

    def start_guard(self, run: int, pgid: int) -> None:
        """Start the log guard of run `run`, whose processes are group `pgid` (blocking: it
        returns once the guard holds the run; call it from a thread)."""
        logcap.start_guard(str(self.path(run)), pgid, self.max_bytes)

    def guarded(self, run: int) -> bool:
        """Whether a log guard keeps run `run` under its cap (True without a file)."""
        return logcap.guarded(str(self.path(run)))

    def tail(self, run: int, nbytes: int = TAIL_BYTES) -> str:
        """The last `nbytes` of run `run`'s log (with the copied older part when the live file
        was just cut), decoded leniently; '' when there is none."""
        data = _read_tail(self.path(run), nbytes)
        if len(data) < nbytes:
            data = _read_tail(self._older_part(run), nbytes - len(data)) + data
        text = data.decode("utf-8", errors="replace")
        return text

    def _older_part(self, run: int) -> Path:
        return self.dir / f"run-{run:04d}.log.1"


def _read_tail(path: Path, nbytes: int) -> bytes:
    if nbytes <= 0:
        return b""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            data = f.read(nbytes)
    except FileNotFoundError:
        return b""
    if size > nbytes:
        # drop the partial first line
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    return data
