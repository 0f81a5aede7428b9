"""The daemon lock: one daemon per VSUP_HOME.

Two `fcntl.flock(LOCK_EX)` locks, both held until the daemon process ends, so whoever finds
them free knows that daemon is gone:
- on the VSUP_HOME directory itself: no file operation can replace a directory, so a lock file
  that is deleted or replaced (`vsup save $VSUP_HOME/daemon.lock` once did it, `rm -rf` of the
  wrong files can) never lets a second daemon start beside the first;
- on `$VSUP_HOME/daemon.lock`, with the holder's pid written in it (what clients read to say
  who holds the home, and what a daemon of an older vsup, which locks only this file, sees).
  A file replaced between its open and its lock is opened again (its inode must still be the
  path's).
A starting daemon retries for `LOCK_RETRY_S` (a client probing the lock holds it for
microseconds) and gives up at once when the holder is a live daemon. A file system that
refuses locks on directories (some network ones) leaves the file lock alone in charge.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

import psutil

LOCK_NAME = "daemon.lock"
# A client probing the lock holds it for microseconds; a starting daemon retries this long
# before concluding that another daemon owns VSUP_HOME.
LOCK_RETRY_S = 2.0
# The directory locks this process holds: kept open for its life (the lock ends with the fd).
_HELD_DIRS: list[int] = []


def acquire_lock(home: Path, retry_s: float = LOCK_RETRY_S) -> int | None:
    """Take the daemon lock; the lock file's fd (keep it open) or None when another daemon
    holds it. The directory's lock is kept by this module for the life of the process."""
    path = home / LOCK_NAME
    deadline = time.monotonic() + retry_s
    dir_fd = _open_dir(home)
    fd = -1
    try:
        if dir_fd is not None and not _lock_retrying(dir_fd, path, deadline):
            return None
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            if not _lock_retrying(fd, path, deadline):
                os.close(fd)
                fd = -1
                return None
            if _same_file(fd, path):
                break
            # replaced between our open and our lock: the lock that counts is the path's
            os.close(fd)
            fd = -1
    finally:
        if fd < 0 and dir_fd is not None:
            os.close(dir_fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    if dir_fd is not None:
        _HELD_DIRS.append(dir_fd)
    return fd


def _open_dir(home: Path) -> int | None:
    """An fd of `home` whose flock works, or None where the file system refuses such locks."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        return fd  # held: it works (and acquire_lock finds out by whom)
    except OSError:
        os.close(fd)
        return None
    return fd


def _lock_retrying(fd: int, path: Path, deadline: float) -> bool:
    """flock(LOCK_EX) on `fd`, retried until `deadline` unless a live daemon holds it."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline or _is_daemon(_pid_in(path)):
                return False
            time.sleep(0.05)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _pid_in(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read_pid(fd)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _is_daemon(pid: int | None) -> bool:
    """Whether `pid` is a live vsup daemon (the lock's holder, not a client probing it)."""
    if not pid or pid == os.getpid():
        return False
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return is_daemon_cmdline(cmd)


# `-m supervisor daemon` is what vsup before 0.2 ran (its import package was `supervisor`): a
# node upgraded while that daemon runs keeps it as the lock holder until it stops, and the new
# client must see it as the daemon it talks to, not as a stranger holding the lock.
DAEMON_MODULES = ("vsup", "supervisor")


def is_daemon_cmdline(cmd: list[str]) -> bool:
    """Whether a command line is a vsup daemon's: `PYTHON -m vsup daemon` (or the pre-0.2
    `-m supervisor daemon`), or the console script's `vsup daemon`, with or without options
    after it (`--poll-interval S`)."""
    for i, word in enumerate(cmd):
        if word != "daemon" or i == 0:
            continue
        if i >= 2 and cmd[i - 2] == "-m" and cmd[i - 1] in DAEMON_MODULES:
            return True
        if os.path.basename(cmd[i - 1]) == "vsup":
            return True
    return False


def daemon_lock_holder(home: Path) -> int | None:
    """The pid of the daemon holding `home`'s lock, or None when no daemon holds it (-1: held,
    by whom the lock file does not say)."""
    path = home / LOCK_NAME
    held = False
    with contextlib.suppress(OSError):
        dir_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
        try:
            held = _held_by_another(dir_fd)
        finally:
            os.close(dir_fd)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return -1 if held else None
    try:
        if _held_by_another(fd) or held:
            pid = _read_pid(fd)
            return pid if pid is not None else -1  # -1: held, no pid written yet
        return None
    finally:
        os.close(fd)


def _held_by_another(fd: int) -> bool:
    """Whether someone holds an exclusive flock on `fd`'s file. Shared and non-blocking: a
    starting daemon that meets this probe retries (LOCK_RETRY_S)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no locks here (a file system that refuses them on directories)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def live_daemon_holder(home: Path) -> int | None:
    """The pid of a live vsup daemon holding `home`'s lock, or None (free, or held by a client
    probing it, or by a pid that is not a daemon)."""
    pid = daemon_lock_holder(home)
    if pid is None or pid <= 0:
        return None
    return pid if _is_daemon(pid) else None
