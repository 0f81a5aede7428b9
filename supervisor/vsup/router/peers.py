"""Who is connected to the router's port: the local users behind a change to its workers.

vllm-router's worker API has no authentication and answers whoever reaches its port, so when
someone else adds or removes a worker vsup can only say who was talking to the router then.
Linux lists every TCP socket with its owner's uid in /proc/net/tcp and /proc/net/tcp6 (readable
by everyone, as `ss` reads them): a client's socket is the one whose remote end is the router's
port. Read only when a change is found, never per request.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable
from pathlib import Path

from vsup.termtext import printable

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
ESTABLISHED = "01"


def connected_uids(text: str, port: int) -> set[int]:
    """The uids that own an established TCP socket to `port`, out of a /proc/net/tcp text."""
    uids = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[3] != ESTABLISHED:
            continue
        try:
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            uid = int(fields[7])
        except (IndexError, ValueError):
            continue
        if remote_port == port:
            uids.add(uid)
    return uids


def user_label(uid: int) -> str:
    """`name (uid N)`, or `uid N` for a uid without a passwd entry."""
    try:
        return f"{printable(pwd.getpwuid(uid).pw_name)} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def other_users(port: int, tables: Iterable[Path] = TCP_TABLES) -> tuple[str, ...]:
    """The users other than this process's own connected to `port` now (empty when the tables
    cannot be read)."""
    uids: set[int] = set()
    for table in tables:
        try:
            uids |= connected_uids(table.read_text(), port)
        except OSError:
            continue
    uids.discard(os.getuid())
    return tuple(user_label(u) for u in sorted(uids))
