"""Who is connected to the router's port, out of /proc/net/tcp (router/peers.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from vsup.router.peers import connected_uids, other_users, user_label

TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2 1
   2: 0100007F:D432 0100007F:1F90 06 00000000:00000000 00:00000000 00000000  1002        0 3 1
   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4 1
   4: 0100007F:D433 0100007F:1F91 01 00000000:00000000 00:00000000 00000000  1003        0 5 1
   5: garbage
"""


def test_the_uids_are_those_of_established_client_sockets_to_the_port():
    # 0x1F90 = 8080: the listener (0A) and the router's own end (local port 8080) are not
    # clients; a socket in TIME_WAIT (06) is gone; port 8081 is another port
    assert connected_uids(TABLE, 8080) == {1001}


def test_a_uid_without_a_name_is_shown_as_a_number():
    assert user_label(0) == "root (uid 0)"
    assert user_label(2**31 - 7) == f"uid {2**31 - 7}"


def test_other_users_leaves_out_our_own_and_reads_the_real_tables(tmp_path: Path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            table = Path("/proc/net/tcp").read_text()
            assert os.getuid() in connected_uids(table, port)
            assert other_users(port) == ()  # only our own connection
    missing = tmp_path / "none"
    assert other_users(8080, tables=[missing]) == ()
