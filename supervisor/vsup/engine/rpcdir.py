"""Where an instance's vLLM puts its ZeroMQ IPC sockets, and their removal.

vLLM binds the sockets between its API server and its EngineCore as files,
`ipc://$VLLM_RPC_BASE_PATH/<uuid4>`, by default in the system's temp directory, and removes
them only when it exits cleanly. Every run that is killed (a crash, an OOM kill, the SIGKILL
after `stop_grace_s`, a whole group killed while no daemon ran) leaves its sockets there for
good: this project's own test runs had left ~9,000 in /tmp in a day. vsup gives each instance
a directory of its own (`VLLM_RPC_BASE_PATH`, unless the layout's or the daemon's environment
names one) and removes the sockets in it before each start and, once a run's processes are
gone, the sockets and then the directory itself when nothing else is in it (a directory per
instance in the temp directory would otherwise stay behind each of them).

The directory is `.rpc` in the instance's log directory when a socket's path fits there (a
unix socket's path is at most 107 bytes; vLLM adds `/` and 36 characters), else a private
directory in the temp directory named after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

ENV = "VLLM_RPC_BASE_PATH"
# sun_path holds 108 bytes with the terminating NUL; vLLM's name is "/" + a uuid4 (36)
_MAX_SOCKET_PATH = 107
_NAME_LEN = 1 + 36


def rpc_dir(log_dir: Path) -> Path:
    """The instance's socket directory, from its log directory (`logs/NAME`)."""
    preferred = Path(log_dir) / ".rpc"
    if len(os.fsencode(preferred)) + _NAME_LEN <= _MAX_SOCKET_PATH:
        return preferred
    digest = hashlib.sha256(os.fsencode(preferred)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"vsup-rpc-{os.getuid()}-{digest}"


def prepare(path: Path) -> None:
    """Create the directory (0700) and remove what an earlier run left in it (blocking)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    clear(path)


def clear(path: Path) -> int:
    """Remove the sockets in `path` (nothing else); how many. Only once no process of the
    instance runs: a live server's sockets are in use (blocking)."""
    removed = 0
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return 0
    for name in names:
        entry = path / name
        try:
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def release(path: Path) -> int:
    """After a run: remove its sockets (`clear`), then the directory when it is empty (the
    next start makes it again); how many sockets. Only once no process of the instance runs
    (blocking)."""
    removed = clear(path)
    # gone already, or it holds something that is not ours to remove: it stays
    with contextlib.suppress(OSError):
        path.rmdir()
    return removed
