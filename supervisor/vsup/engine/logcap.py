"""A run log's size cap, and the process that holds it for as long as the run lives, with or
without a daemon (runlog.py has the files; docs/ARCHITECTURE.md, "Run logs").

The child writes its log file itself (O_APPEND; no pipe, nothing of vsup's in its output's
path), so an instance logs on while no daemon runs - and so the cap cannot live in the daemon
either: a chatty server wrote 507 MiB in 20 s after its daemon was killed. Each run gets a
**log guard**: a small process (this file run as a script, `python -I -S logcap.py PATH PGID
MAX_BYTES`: stdlib only, no vsup import, ~3 MiB of private memory) started beside the child
(`start_guard`), in a session of its own, neither the child's descendant nor in its process
group - so stopping, sweeping and re-adopting the instance (pid + start time + group) see
nothing new, and a daemon that dies takes nothing with it. It:
- holds an exclusive `flock` on the run's file for its life: one guard per run; `guarded`
  tells the daemon whether one holds it (its chores start one for a run that has none: a run
  adopted from an older vsup, a guard that died);
- checks the file's disk use every `CAP_CHECK_S` while it grows (`FAST_CHECK_S` while it grows
  by more than a step between checks; backing off to `IDLE_CHECK_S` while it does not) and
  keeps it under the cap (`cap_file`): past `max_bytes + step` the middle
  is released with `fallocate(PUNCH_HOLE)` (the start of the run and its latest part stay,
  offsets never change: readers skip the hole), or where holes cannot be punched the file is
  copied to `.1` and truncated;
- ends once no process of the run's group is left (after a last check), or the file is
  deleted (a run past `keep`).
A run's disk use stays under max_bytes + step + what the server writes in one check (a second
after a quiet spell), daemon or not.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from typing import Any

CAP_CHECK_S = 0.25  # between checks while the file grows
FAST_CHECK_S = 0.1  # ... by more than a step between two checks (a server logging 30 MB/s)
IDLE_CHECK_S = 1.0  # ... backing off to this while it does not
LOCK_WAIT_S = 2.0  # a guard waits this long for a run's lock (a daemon's probe holds it briefly)
HEAD_BYTES = 1024 * 1024  # the start of a run that a hole never takes (at most max_bytes / 8)
PUNCH_MIN_BYTES = 1024 * 1024
RESET_BYTES = 64 * 1024**3
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_NO_PUNCH: set[int] = set()  # devices whose file system refused a hole


def head_bytes(max_bytes: int) -> int:
    """The start of a run kept when its middle is released."""
    return min(HEAD_BYTES, max_bytes // 8)


def step_bytes(max_bytes: int) -> int:
    """How far past the cap a run may grow before the next release (fewer, larger ones)."""
    return max(64 * 1024, max_bytes // 16)


def older_part(path: str) -> str:
    """Where the copy-and-truncate fallback puts the older part of `path`."""
    return path + ".1"


def on_disk(st: os.stat_result) -> int:
    """Bytes a file holds on disk: its blocks (a released part holds none), not its size."""
    return min(st.st_size, st.st_blocks * 512) if st.st_blocks else st.st_size


def cap_file(path: str, max_bytes: int) -> bool:
    """Keep `path` under `max_bytes` on disk (see the module doc); True if it released or cut
    part of it. Raises FileNotFoundError when the file is gone, OSError when a copy fails."""
    st = os.stat(path)
    punch = _punches(st, max_bytes)
    if on_disk(st) <= max_bytes + (step_bytes(max_bytes) if punch else 0):
        return False
    if punch:
        released = _release(path, st, max_bytes)
        if released is not None:
            return released
    return _copy_truncate(path, max_bytes)


def _punches(st: os.stat_result, max_bytes: int) -> bool:
    """Whether this file's cap releases a hole (else it copies and truncates)."""
    return (
        max_bytes >= PUNCH_MIN_BYTES
        and st.st_size < RESET_BYTES
        and st.st_dev not in _NO_PUNCH
        and _libc_fallocate() is not None
    )


def _release(path: str, st: os.stat_result, max_bytes: int) -> bool | None:
    """Punch the middle out (head and latest part kept); None when the file system refuses
    (the caller copies and truncates instead)."""
    block = max(512, st.st_blksize or 4096)
    start = -(-head_bytes(max_bytes) // block) * block
    end = (st.st_size - (max_bytes - head_bytes(max_bytes))) // block * block
    if end <= start:
        return False
    fd = os.open(path, os.O_WRONLY)
    try:
        if _punch(fd, start, end - start):
            return True
    finally:
        os.close(fd)
    _NO_PUNCH.add(st.st_dev)
    return None


def _copy_truncate(path: str, max_bytes: int) -> bool:
    older = older_part(path)
    tmp = older + ".tmp"
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(tmp, older)
    with open(path, "r+b") as f:
        f.truncate(0)
    with open(path, "ab", buffering=0) as f:
        f.write(
            f"[vsup] log passed {max_bytes} bytes: the part before this line is in "
            f"{os.path.basename(older)}\n".encode()
        )
    return True


_FALLOCATE: list[Any] = []


def _libc_fallocate() -> Any:
    """libc's fallocate(2) through ctypes (os has no hole punching), or None off Linux. The
    process's own symbols (ctypes.CDLL(None)) hold libc's: no ctypes.util lookup to import."""
    if not _FALLOCATE:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
        except (ImportError, OSError, AttributeError):
            fn = None
        _FALLOCATE.append(fn)
    return _FALLOCATE[0]


def _punch(fd: int, offset: int, length: int) -> bool:
    """Release `length` bytes at `offset` (the file keeps its size); False when refused."""
    fn = _libc_fallocate()
    if fn is None:
        return False
    if fn(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(err, os.strerror(err))
    return False


# -- the guard process ------------------------------------------------------------------------


def guard_command(path: str, pgid: int, max_bytes: int) -> list[str]:
    """The guard of run log `path` for the run whose process group is `pgid`."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), path, str(pgid), str(max_bytes)]


def start_guard(path: str, pgid: int, max_bytes: int) -> None:
    """Start the guard of `path` and return once it holds the run's lock (or found that another
    guard does). Blocking (fork/exec, the guard's start): call it from a thread."""
    import subprocess

    with open(path, "ab", buffering=0) as out:  # a guard that breaks says why in the run's log
        first = subprocess.Popen(
            guard_command(path, pgid, max_bytes),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    first.wait()  # it forks the guard and exits once the guard holds the lock: no zombie


def guarded(path: str) -> bool:
    """Whether a guard holds run log `path` (True when there is no such file: nothing to do).
    One open and two flocks: cheap enough for the engine's chores."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def guard(path: str, pgid: int, max_bytes: int, locked: int | None = None) -> int:
    """Keep `path` under its cap while process group `pgid` lives (see the module doc).
    `locked`: a pipe's write end, closed once the lock is held (or not to be had)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return 0  # another guard keeps this run
                time.sleep(0.05)
    finally:
        if locked is not None:
            os.close(locked)
    size = -1
    wait = CAP_CHECK_S
    while True:
        alive = group_alive(pgid)
        st = os.fstat(fd)
        if st.st_nlink == 0:
            return 0  # deleted: a run past the instance's `keep`
        try:
            cap_file(path, max_bytes)
        except FileNotFoundError:
            return 0
        except OSError as exc:  # a full disk (the copy), a file made read-only: try again
            print(f"[vsup] log guard: cannot keep {path} under its cap: {exc}", file=sys.stderr)
            wait = IDLE_CHECK_S
        if not alive:
            return 0
        grown, size = (st.st_size - size if size >= 0 else 0), st.st_size
        if grown > step_bytes(max_bytes):
            wait = FAST_CHECK_S  # it writes a step between two checks: look sooner
        elif grown:
            wait = CAP_CHECK_S
        else:
            wait = min(wait * 2, IDLE_CHECK_S)
        time.sleep(wait)


def main(argv: list[str]) -> int:
    """`logcap.py PATH PGID MAX_BYTES`: fork the guard (so that it is nobody's child once
    this process exits), wait until it holds the run's lock, exit."""
    path, pgid, max_bytes = argv[0], int(argv[1]), int(argv[2])
    r, w = os.pipe()
    if os.fork() > 0:
        os.close(w)
        os.read(r, 1)  # b"" once the guard closed its end: it holds the lock, or gave up
        return 0
    os.close(r)
    os.chdir("/")  # holds no directory of the daemon's (VSUP_HOME may be unmounted)
    return guard(path, pgid, max_bytes, locked=w)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
