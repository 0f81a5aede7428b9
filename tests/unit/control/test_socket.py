"""The control socket: private (0600, in a directory vsup made private or found private), unix only, and the client's errors."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from vsup.control.client import Client, check_socket_path, connect
from vsup.control.errors import DaemonUnavailable
from vsup.control.server import bind_unix_socket


def test_socket_is_0600_even_with_an_open_umask_and_its_dir_keeps_its_mode(vsup_home):
    os.chmod(vsup_home, 0o755)
    old = os.umask(0)
    try:
        sock = bind_unix_socket(vsup_home / "vsup.sock")
    finally:
        os.umask(old)
    try:
        mode = os.stat(vsup_home / "vsup.sock").st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        # The directory is the user's own (nobody else can write to it): vsup leaves its mode.
        assert stat.S_IMODE(os.stat(vsup_home).st_mode) == 0o755
        assert sock.family == socket.AF_UNIX
    finally:
        sock.close()


def test_stale_socket_of_a_killed_daemon_is_replaced(vsup_home):
    first = bind_unix_socket(vsup_home / "vsup.sock")
    first.close()  # the file stays, like after SIGKILL
    second = bind_unix_socket(vsup_home / "vsup.sock")
    try:
        assert stat.S_ISSOCK(os.stat(vsup_home / "vsup.sock").st_mode)
        second.listen(1)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(vsup_home / "vsup.sock"))  # the new socket answers
    finally:
        second.close()


def test_a_regular_file_in_the_sockets_place_is_not_removed(vsup_home):
    (vsup_home / "vsup.sock").write_text("mine")
    with pytest.raises(FileExistsError, match="not a socket"):
        bind_unix_socket(vsup_home / "vsup.sock")
    assert (vsup_home / "vsup.sock").read_text() == "mine"


def test_too_long_socket_path_names_the_setting_to_change(tmp_path):
    with pytest.raises(DaemonUnavailable, match="VSUP_HOME"):
        check_socket_path(tmp_path / ("x" * 120) / "vsup.sock")


def test_client_without_daemon_reports_unavailable(vsup_home):
    client = Client(vsup_home)
    assert client.alive() is None
    with pytest.raises(DaemonUnavailable):
        client.status()
    with pytest.raises(DaemonUnavailable, match="no vsup daemon runs for VSUP_HOME="):
        connect(vsup_home, start=False)
