"""Find and end every process a test or benchmark started, whatever group or session it moved
to: each carries a token in its environment (children inherit it), and /proc tells who has it.
Stdlib only; used by the engine tests and the benchmarks alike."""

from __future__ import annotations

import contextlib
import os
import signal


def token_pids(token: str, var: str = "VSUP_TEST_TOKEN") -> list[int]:
    """Live (non-zombie) processes whose environment has `var=token`."""
    needle = f"{var}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != b"Z":
            found.append(int(entry))
    return found


def kill_token(token: str, var: str = "VSUP_TEST_TOKEN") -> list[int]:
    """SIGKILL every process carrying the token; the pids that were still alive."""
    pids = token_pids(token, var)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids
