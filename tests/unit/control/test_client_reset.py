"""A daemon that exits resets the connections it still holds (vsup down polls status while it
does): the client says the daemon is gone, it does not crash with httpx's ReadError."""

from __future__ import annotations

import select
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from vsup.control.client import Client
from vsup.control.errors import DaemonUnavailable


def resetting_server(path: Path) -> threading.Thread:
    """Accept one connection and close it with the request unread: the client's read then
    fails with ECONNRESET, as when a daemon exits holding requests it has not answered."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        select.select([conn], [], [], 5)  # the request has arrived; it is never read
        conn.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_connection_reset_mid_request_is_daemon_unavailable() -> None:
    home = Path(tempfile.mkdtemp(prefix="vsup-", dir="/tmp"))
    sock = home / "vsup.sock"
    t = resetting_server(sock)
    client = Client(socket=sock)
    try:
        with pytest.raises(DaemonUnavailable):
            client.status()
    finally:
        client.close()
        t.join(5)
        shutil.rmtree(home, ignore_errors=True)  # it held the socket: it stayed in /tmp
