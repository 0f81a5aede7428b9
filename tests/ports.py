"""Loopback ports for the servers tests start: the one place tests get them.

A port asked for now is bound only later, when a layout starts, so three things can take it in
between, each seen in CI:
- the kernel hands the same ephemeral port out twice in a row (two instances of one layout on
  one port);
- the other xdist worker asks for ports too, with no idea of this one's;
- any process's outgoing connection, or a port vLLM takes for itself (its engine and
  torch.distributed sockets bind port 0), sits on an ephemeral port: a router port that way
  failed with port_in_use three times over (stop 34).
So ports come from outside the kernel's ephemeral range, from a slice of it per xdist worker,
never twice per process, and in pairs: a router's metrics port defaults to its port + 1, so the
port after each one handed out is free too and never handed out itself.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()


def _ephemeral() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _pool() -> range:
    """The ports below the ephemeral range (from 10000) or, where that is too small, above it."""
    low, high = _ephemeral()
    if low - 10000 >= 4000:
        return range(10000, low)
    return range(high + 1, 65535)


def _slice() -> range:
    """This worker's part of the pool: gw0, gw1, ... each their own (the controller's run, or a
    run without xdist, gets the first)."""
    pool = _pool()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    size = len(pool) // count
    start = pool.start + index * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port nobody listens on now, with the one after it free as well; never
    one this process handed out before, nor its neighbour."""
    span = _slice()
    # even ports only, from a random point of the slice: two pytest runs on one machine (a
    # developer's and a helper's) rarely meet
    first = span.start + (span.start % 2)
    evens = range(first, span.stop - 1, 2)
    offset = random.randrange(len(evens))
    for i in range(len(evens)):
        port = evens[(offset + i) % len(evens)]
        if port in _HANDED_OUT:
            continue
        if _bindable(port) and _bindable(port + 1):
            _HANDED_OUT.update((port, port + 1))
            return port
    raise RuntimeError(f"no free loopback port pair left in {span.start}-{span.stop - 1}")
