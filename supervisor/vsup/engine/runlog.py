"""Per-run log files: `logs_dir/NAME/run-NNNN.log`, one per spawn, stdout and stderr together.

The child writes its file directly (opened O_APPEND), never through a pipe to the daemon: an
instance must outlive the daemon and keep logging while no daemon runs.

Limits, so 64 instances that crash-loop or log every request cannot fill the disk:
- only the last `keep` runs of an instance are kept (default 5); older run files are deleted
  when a new run starts;
- a live run holds at most `max_bytes` on disk (default 32 MiB), enforced while it runs: a
  guard thread (`CapGuard`, every `CAP_CHECK_S`) looks at every live run the engine's chores
  registered (`over_cap`) and, past the cap, releases the middle of the file with
  `fallocate(PUNCH_HOLE)`: the start of the run (`head_bytes`, vLLM's start-up lines) and its
  latest part stay, the child's O_APPEND writes go on at the end, and no line is lost or
  moved. Offsets never change, so a reader that follows the file by offset (`vsup logs -f`,
  the log watcher, the dashboard) stays correct: the released part reads as a hole, which
  readers skip (`fsutil.data_from`) saying how much was released. On disk a run holds at most
  max_bytes + `step_bytes` + what the server writes in one check interval (40 MB/s of output:
  about 10 MB); a run's apparent size (`ls -l`) keeps growing, its disk use (`du`) does not;
- where the file system cannot punch holes (or for caps under `PUNCH_MIN_BYTES`) and once a
  file's apparent size passes `RESET_BYTES` (so it never nears a file-size limit), the live
  file is copied to `run-NNNN.log.1` (replacing the previous copy) and truncated to zero
  instead: lines written between the copy and the truncation are lost, a marker line says
  where the older part went, and readers see the file shrink and start it again. A run then
  holds about 2 x max_bytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

_RUN_FILE = re.compile(r"^run-(\d+)\.log(\.1)?$")

DEFAULT_KEEP = 5
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
TAIL_BYTES = 64 * 1024
HEAD_BYTES = 1024 * 1024  # the start of a run that a hole never takes (at most max_bytes / 8)
CAP_CHECK_S = 0.25
PUNCH_MIN_BYTES = 1024 * 1024
RESET_BYTES = 64 * 1024**3
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


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

    def path(self, run: int) -> Path:
        return self.dir / f"run-{run:04d}.log"

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
        return min(HEAD_BYTES, self.max_bytes // 8)

    @property
    def step_bytes(self) -> int:
        """How far past the cap a run may grow before the next release (fewer, larger ones)."""
        return max(64 * 1024, self.max_bytes // 16)

    def over_cap(self, run: int) -> bool:
        """Whether run `run`'s live file holds more than the cap (one stat: cheap on the loop).
        Registers the run with the guard thread, which keeps it under the cap from now on."""
        path = self.path(run)
        GUARD.watch(self, run)
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        return _on_disk(st) > self.max_bytes + (self.step_bytes if self._punches(st) else 0)

    def cap(self, run: int) -> bool:
        """Keep run `run`'s live file under `max_bytes` (see the module doc); True if it cut or
        released part of it."""
        with _CAP_LOCK:
            path = self.path(run)
            try:
                st = path.stat()
            except FileNotFoundError:
                return False
            punch = self._punches(st)
            if _on_disk(st) <= self.max_bytes + (self.step_bytes if punch else 0):
                return False
            if punch:
                released = self._release(path, st)
                if released is not None:
                    return released
            return self._copy_truncate(path, run)

    def _punches(self, st: os.stat_result) -> bool:
        """Whether this file's cap releases a hole (else it copies and truncates)."""
        return (
            self.max_bytes >= PUNCH_MIN_BYTES
            and st.st_size < RESET_BYTES
            and st.st_dev not in _NO_PUNCH
            and _libc_fallocate() is not None
        )

    def _release(self, path: Path, st: os.stat_result) -> bool | None:
        """Punch the middle out (head and latest part kept); None when the file system
        refuses (the caller copies and truncates instead)."""
        block = max(512, st.st_blksize or 4096)
        start = -(-self.head_bytes // block) * block
        end = (st.st_size - (self.max_bytes - self.head_bytes)) // block * block
        if end <= start:
            return False
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return False
        try:
            if _punch(fd, start, end - start):
                return True
        finally:
            os.close(fd)
        _NO_PUNCH.add(st.st_dev)
        log.warning("the file system of %s cannot punch holes: logs past their cap are copied "
                    "and truncated instead", path.parent)  # fmt: skip
        return None

    def _copy_truncate(self, path: Path, run: int) -> bool:
        older = self._older_part(run)
        tmp = older.with_name(older.name + ".tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, older)
        with open(path, "r+b") as f:
            f.truncate(0)
        with open(path, "ab", buffering=0) as f:
            f.write(
                f"[vsup] log passed {self.max_bytes} bytes: the part before this line is in "
                f"{older.name}\n".encode()
            )
        return True

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


class CapGuard:
    """The thread that keeps live runs under their cap between the engine's chores (every
    `interval` seconds: a server can write a gigabyte in the chores' 5 s). A run is watched
    from its first `over_cap` until a later run of the same instance replaces it or its file
    is gone; each check is one stat per watched run."""

    def __init__(self, interval: float = CAP_CHECK_S) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._runs: dict[Path, tuple[RunLogs, int]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, logs: RunLogs, run: int) -> None:
        with self._lock:
            known = self._runs.get(logs.dir)
            if known is not None and known[1] == run:
                return
            self._runs[logs.dir] = (logs, run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="log caps", daemon=True)
                self._thread.start()

    def watched(self) -> list[Path]:
        """The live run files under watch (tests and benchmarks read it)."""
        with self._lock:
            return [logs.path(run) for logs, run in self._runs.values()]

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            with self._lock:
                runs = list(self._runs.items())
            for directory, (logs, run) in runs:
                try:
                    logs.cap(run)
                except FileNotFoundError:
                    pass
                except OSError as exc:  # a full disk (the copy), a file made read-only
                    log.warning("cannot keep %s under its cap: %s", logs.path(run), exc)
                if not logs.path(run).exists():
                    with self._lock:
                        if self._runs.get(directory) == (logs, run):
                            del self._runs[directory]


GUARD = CapGuard()
_CAP_LOCK = threading.Lock()
_NO_PUNCH: set[int] = set()  # devices whose file system refused a hole


def _on_disk(st: os.stat_result) -> int:
    """Bytes a file holds on disk: its blocks (a released part holds none), not its size."""
    return min(st.st_size, st.st_blocks * 512) if st.st_blocks else st.st_size


@functools.cache
def _libc_fallocate() -> Any:
    """libc's fallocate(2) through ctypes (os has no hole punching), or None off Linux."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


def _punch(fd: int, offset: int, length: int) -> bool:
    """Release `length` bytes at `offset` (the file keeps its size); False when refused."""
    fn = _libc_fallocate()
    if fn is None:
        return False
    if fn(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(err, os.strerror(err))
    return False


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
