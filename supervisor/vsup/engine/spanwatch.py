"""A span follower's view of its head (docs/fleet.md, "Watched as one").

A follower runs ranks headless: no API server, nothing of its own to ask. What it serves is
its head's: its health is the head's `/health` (`InstanceSpec.client_host`), and the runner
follows it with two rules, kept here as pure decisions so that they are tested without vLLM:

- **Ready only behind a head that started after it.** vLLM's head answers `/health` only once
  every rank joined it (it waits for the DP coordinator's READY first), so a new head is always
  preceded by a time it does not answer. A follower that starts while an old head still answers
  200 (the head lies: one of its ranks is gone and its requests hang, ../shared/VLLM-FACTS.md)
  has not joined that head: it is not ready until it has seen the head not answer and then
  answer again. Its first look is taken just before its spawn (the runner's
  `_head_before_spawn`): looked at after it, a follower that joins fast, or a daemon slow to
  look, first sees the head it has just joined answer and takes it for an older one.
- **The head going away restarts the follower.** A ready follower whose head stops answering
  (`unhealthy_after` checks in a row; a head that gives no answer at all for
  `unhealthy_grace_s`, as for any instance: a busy head is not a gone one) is ended and started
  again by the restart policy, so that it joins the head's next run: a follower's engine joins
  a head once, at its start. That is `Lifecycle.health_failed`, with the words of `gone_why`.

- **A head replaced during the follower's start restarts the follower at once.** Each of a
  follower's engine processes says HELLO once to the head's data-parallel RPC port (vLLM's
  handshake: a ZMQ DEALER socket, open until the engine's READY) and waits for the head's
  answer; when that head dies, ZMQ connects the same socket to the next head on that port, which
  waits for a HELLO that never comes again, while the follower waits for vLLM's
  HANDSHAKE_TIMEOUT_MINS (5) and a READY it sends late kills the new head ("Unexpected READY
  message"). So a starting follower's process whose established connection to the head's RPC
  port is made again (another local port, the same process: `HeadLink`) is bound to a head that
  is gone, and is ended and started again now (`replaced_why`). Cheap: one read of the
  node's TCP table and of the tree's socket fds per health check, only while a follower
  starts; no port or agent of vsup's, nothing asked of the head.

Together with the head's own watch (a probe per rank, `layout/span.py`), any member's death
restarts the head, the head's restart restarts the followers, and the unit serves again.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from vsup.layout.spec import SpanRole


@dataclass
class HeadWatch:
    """One follower run's view of its head while it starts. `trusted`: the run was adopted
    from an earlier daemon (it joined whatever head answers now)."""

    trusted: bool = False
    seen_down: bool = False  # the head did not answer 200 once since just before this run's spawn

    def ready(self, head_ok: bool) -> bool:
        """Whether this answer of the head's `/health` makes the starting follower ready."""
        if not head_ok:
            self.seen_down = True
            return False
        return self.trusted or self.seen_down


def waiting_words(role: SpanRole, head_ok: bool) -> str:
    """What a starting follower waits for (its `wait`, kind `span_head`; said after "waits
    for"): the head to answer, or, while an older head still answers, the head's next run."""
    if not head_ok:
        return (
            f"{head_where(role)}: no answer on /health yet (a head answers once every rank "
            "joined it)"
        )
    return (
        f"{head_where(role)} to start again: the head that answers started before this "
        "follower, and a follower joins a head only at its start"
    )


def head_where(role: SpanRole) -> str:
    return f"its head {role.head_node} at {role.address}:{role.port}"


def gone_why(role: SpanRole, status: int | None) -> str:
    """Why a follower is ended when its head stopped answering."""
    said = f"said {status}" if status is not None else "did not answer"
    return (
        f"{head_where(role)} {said} on /health: the head is gone or restarting, and a follower "
        "joins a head only at its start; restarting to join the head's next run"
    )


def replaced_why(role: SpanRole) -> str:
    """Why a starting follower is ended when the head it said HELLO to was replaced."""
    return (
        f"{head_where(role)} was replaced during this follower's start (its connection to the "
        f"head's RPC port {role.address}:{role.rpc_port} was made again, to a head that never "
        "got its HELLO): restarting to join the new head now, not after vLLM's 5-minute "
        "handshake limit"
    )


# /proc/net/tcp's states: what a connecting or connected socket is in
_ESTABLISHED = "01"


@dataclass
class HeadLink:
    """One follower run's connections to its head's data-parallel RPC port, while it starts.

    `replaced(conns)` is fed each check's established connections as (pid, local port): a
    process seen connected from one local port and later from another made its connection
    again (ZMQ reconnects a socket whose peer went away), so the head it joined is gone. A
    connection that simply ends (vLLM closes its handshake socket after READY) says nothing."""

    first: dict[int, int] = field(default_factory=dict)  # pid -> its first local port
    addresses: frozenset[str] | None = None  # the head's address resolved, once per run

    def replaced(self, conns: Iterable[tuple[int, int]]) -> bool:
        again = False
        for pid, local_port in conns:
            seen = self.first.setdefault(pid, local_port)
            again = again or seen != local_port
        return again


def head_addresses(address: str) -> frozenset[str]:
    """The head's address as IPs (blocking: a name is resolved). Empty when it cannot be
    resolved: then any address on the RPC port counts (`rpc_connections`)."""
    try:
        return frozenset(_ip(str(a[4][0])) for a in socket.getaddrinfo(address, None))
    except (OSError, UnicodeError, ValueError):
        return frozenset()


def rpc_connections(
    pids: Iterable[int], port: int, addresses: frozenset[str], proc_root: str = "/proc"
) -> list[tuple[int, int]]:
    """(pid, local port) of every established TCP connection from one of `pids` to
    `addresses`:`port` (blocking: reads /proc). A socket connected to itself (a connect to a
    free local port can be) is no head's."""
    owners: dict[str, int] = {}
    net_of: int | None = None
    for pid in pids:
        try:
            fds = os.listdir(f"{proc_root}/{pid}/fd")
        except OSError:
            continue
        net_of = pid if net_of is None else net_of
        for fd in fds:
            try:
                target = os.readlink(f"{proc_root}/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], pid)
    if not owners or net_of is None:
        return []
    found = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/{net_of}/net/{name}") as f:
                text = f.read()
        except OSError:
            continue
        for local, lport, remote, rport, state, inode in parse_tcp_table(text):
            if (
                state != _ESTABLISHED
                or rport != port
                or inode not in owners
                or (addresses and remote not in addresses)
                or (local, lport) == (remote, rport)
            ):
                continue
            found.append((owners[inode], lport))
    return found


def parse_tcp_table(
    text: str, byteorder: str = sys.byteorder
) -> list[tuple[str, int, str, int, str, str]]:
    """/proc/net/tcp or tcp6 as (local ip, local port, remote ip, remote port, state, inode);
    an IPv4 address mapped into IPv6 reads as IPv4. The kernel prints each 32-bit word of an
    address as a number in its own byte order (`byteorder`: this machine's)."""
    rows = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        try:
            local, lport = _endpoint(cols[1], byteorder)
            remote, rport = _endpoint(cols[2], byteorder)
        except ValueError:
            continue
        rows.append((local, lport, remote, rport, cols[3], cols[9]))
    return rows


def _endpoint(hexed: str, byteorder: str) -> tuple[str, int]:
    addr, _, port = hexed.partition(":")
    raw = bytes.fromhex(addr)
    if len(raw) not in (4, 16):
        raise ValueError(hexed)
    if byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _ip(str(ipaddress.ip_address(raw))), int(port, 16)


def _ip(text: str) -> str:
    ip = ipaddress.ip_address(text.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)
