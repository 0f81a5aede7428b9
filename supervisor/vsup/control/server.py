"""uvicorn servers run as tasks on the daemon's loop, on sockets vsup binds itself.

vsup binds the sockets so that it controls their permissions (uvicorn's own `uds=` makes the
socket 0666 after binding) and sees bind errors as OSError instead of uvicorn's `sys.exit`. The
daemon, not uvicorn, owns the signals (SIGTERM must leave instances running), so the servers
install no signal handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Generator
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

log = logging.getLogger(__name__)


class LoopServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_unix_socket(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600 (its directory is VSUP_HOME, which
    `paths.vsup_home` made private or found private; its mode is not changed here).

    The umask is tightened around bind so the socket never exists with wider permissions,
    not even for the moment between bind and chmod. The caller must hold the daemon lock:
    a stale socket file left by a killed daemon is removed here.
    """
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            path.unlink()
        else:
            raise FileExistsError(f"{path} exists and is not a socket; remove it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def bind_tcp_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (for the opt-in Prometheus listener)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class ServedApp:
    """One ASGI app served by uvicorn on one pre-bound socket, as a task on the running loop."""

    def __init__(self, app: ASGIApp, sock: socket.socket, name: str) -> None:
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=3,
            # The control API answers one local client at a time; keep-alive lets the TUI
            # reuse its connection.
            timeout_keep_alive=30,
        )
        self.server = LoopServer(config)
        self.sock = sock
        self.name = name
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Start serving; returns once the server accepts connections."""
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name=self.name)
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError(f"{self.name} stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, let answers in flight finish (bounded), close the socket."""
        if self._task is None:
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except TimeoutError:
            self.server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:
            log.exception("%s failed while stopping", self.name)
        self._task = None
        with contextlib.suppress(OSError):
            self.sock.close()
