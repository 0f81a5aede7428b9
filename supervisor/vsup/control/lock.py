"""The daemon lock: one daemon per VSUP_HOME.

`fcntl.flock(LOCK_EX)` on `$VSUP_HOME/daemon.lock` (the holder's pid written in it), held until
the daemon process ends, so whoever finds the lock free knows that daemon is gone. A starting
daemon retries for `LOCK_RETRY_S` (a client probing the lock holds it for microseconds) and
gives up at once when the holder is a live daemon.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import psutil

LOCK_NAME = "daemon.lock"
# A client probing the lock holds it for microseconds; a starting daemon retries this long
# before concluding that another daemon owns VSUP_HOME.
LOCK_RETRY_S = 2.0


def acquire_lock(home: Path, retry_s: float = LOCK_RETRY_S) -> int | None:
    """Take the daemon lock; the fd (keep it open) or None when another daemon holds it."""
    path = home / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + retry_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline or _is_daemon(_read_pid(fd)):
                os.close(fd)
                return None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


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
    """The pid of the daemon holding `home`'s lock, or None when no daemon holds it."""
    path = home / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            # Shared and non-blocking: a starting daemon that meets it retries (LOCK_RETRY_S).
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            return pid if pid is not None else -1  # -1: held, no pid written yet
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def live_daemon_holder(home: Path) -> int | None:
    """The pid of a live vsup daemon holding `home`'s lock, or None (free, or held by a client
    probing it, or by a pid that is not a daemon)."""
    pid = daemon_lock_holder(home)
    if pid is None or pid <= 0:
        return None
    return pid if _is_daemon(pid) else None
