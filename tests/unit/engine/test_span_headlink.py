"""A span follower's connection to its head's RPC port (engine/spanwatch.py, docs/fleet.md
"Watched as one"): the same process connected again from another local port means the head
it said HELLO to was replaced; the words name the head; /proc's TCP table is read right."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from vsup.engine.spanwatch import (
    HeadLink,
    head_addresses,
    parse_tcp_table,
    replaced_why,
    rpc_connections,
)
from vsup.layout.compiled import compile_document
from vsup.layout.model import loads_layout

LAYOUT = """[layout]
name = "unit"
node = "gpu02"

[[instance]]
name = "big"
model = "acme/tiny-model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
gpus = []
port = 8000
span = { ranks = { gpu01 = 1, gpu02 = 2 }, address = "10.0.0.1", rpc_port = 13345 }
"""


def test_a_connection_made_again_by_the_same_process_means_its_head_was_replaced():
    link = HeadLink()
    assert not link.replaced([])  # not connected yet: the head does not listen
    assert not link.replaced([(10, 40001)])  # rank 1's engine said HELLO
    assert not link.replaced([(10, 40001), (11, 40007)])  # rank 2's engine, its own socket
    assert not link.replaced([(11, 40007)])  # rank 1 said READY and closed: nothing news
    assert not link.replaced([])  # the head is gone; its socket retries
    assert link.replaced([(11, 40123)])  # ... and reached a new head: rank 2 is bound to nothing


def test_the_words_name_the_head_and_its_rpc_port():
    compiled, diagnostics = compile_document(loads_layout(LAYOUT, Path("/l")))
    assert compiled is not None, [d.format() for d in diagnostics]
    role = compiled.specs[0].span
    assert role is not None and not role.head
    assert replaced_why(role) == (
        "its head gpu01 at 10.0.0.1:8000 was replaced during this follower's start (its "
        "connection to the head's RPC port 10.0.0.1:13345 was made again, to a head that never "
        "got its HELLO): restarting to join the new head now, not after vLLM's 5-minute "
        "handshake limit"
    )


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:3419 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0 100 0 0 10 0
   1: 0100007F:9C41 0100007F:3419 01 00000000:00000000 00:00000000 00000000  1000        0 222 1 0 20 4 30 10 -1
   2: 0100007F:9C42 0100007F:3419 02 00000000:00000000 00:00000000 00000000  1000        0 333 1 0 20 4 30 10 -1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:9C43 0000000000000000FFFF00000100007F:3419 01 00000000:00000000 00:00000000 00000000  1000        0 444 1 0 20 4 30 10 -1
   1: 00000000000000000000000001000000:9C44 00000000000000000000000001000000:3419 01 00000000:00000000 00:00000000 00000000  1000        0 555 1 0 20 4 30 10 -1
"""


def _big_endian(table: str) -> str:
    """The same table as a big-endian kernel prints it: each 32-bit word of the two address
    columns with its bytes reversed."""

    def swapped(field: str) -> str:
        addr, port = field.split(":")
        raw = bytes.fromhex(addr)
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        return f"{words.hex().upper()}:{port}"

    lines = table.splitlines()
    rows = [line.split() for line in lines[1:]]
    body = [" ".join([r[0], swapped(r[1]), swapped(r[2]), *r[3:]]) for r in rows]
    return "\n".join([lines[0], *body]) + "\n"


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_the_tcp_table_reads_as_addresses_ports_states_and_inodes(byteorder):
    tcp, tcp6 = (TCP, TCP6) if byteorder == "little" else (_big_endian(TCP), _big_endian(TCP6))
    assert parse_tcp_table(tcp, byteorder) == [
        ("127.0.0.1", 13337, "0.0.0.0", 0, "0A", "111"),
        ("127.0.0.1", 40001, "127.0.0.1", 13337, "01", "222"),
        ("127.0.0.1", 40002, "127.0.0.1", 13337, "02", "333"),
    ]
    # an IPv4 address mapped into IPv6 reads as IPv4; ::1 as itself
    assert parse_tcp_table(tcp6, byteorder) == [
        ("127.0.0.1", 40003, "127.0.0.1", 13337, "01", "444"),
        ("::1", 40004, "::1", 13337, "01", "555"),
    ]


def test_a_processes_established_connections_to_the_rpc_port_are_found_in_proc(tmp_path):
    """This process as the follower: a connection to a listening port is found with its local
    port, one to another port or from another process is not; a name resolves."""
    with socket.socket() as head, socket.socket() as other:
        head.bind(("127.0.0.1", 0))
        head.listen()
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = head.getsockname()[1]
        with (
            socket.create_connection(("127.0.0.1", port)) as conn,
            socket.create_connection(other.getsockname()),
        ):
            local = conn.getsockname()[1]
            assert "127.0.0.1" in head_addresses("127.0.0.1")
            me = os.getpid()
            assert rpc_connections([me], port, head_addresses("127.0.0.1")) == [(me, local)]
            assert rpc_connections([me], port, frozenset()) == [(me, local)]  # any address
            assert rpc_connections([me], port, frozenset({"10.9.9.9"})) == []
            assert rpc_connections([], port, frozenset()) == []
            assert rpc_connections([2**22 + 7], port, frozenset()) == []  # no such process
    assert head_addresses("no-such-host.invalid") == frozenset()
