"""The fleet's transport choice, measured: OpenSSH (what vsup uses) against asyncssh.

    python -m benchmarks.fleet_transport [--rounds 5]

One node (an sshd on 127.0.0.1 with its own host key and a vsup daemon, as
tests/integration/fleet/sshnodes.py builds it). For each client: connect and run a command
(authentication and the host key check included), forward the daemon's unix socket to a local
one, then `GET /v1/status` through it (first and warm: median of 20). OpenSSH runs as vsup runs
it (ControlMaster auto + ControlPersist, `-O forward`); asyncssh in this process
(`asyncssh.connect`, `forward_local_path`). asyncssh is not a dependency of vsup: install it
into the environment to run this (`pip install asyncssh`); without it only OpenSSH is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import install_cleanup, last_line  # noqa: E402
from tests.integration.fleet.sshnodes import SshFleet, sshd_missing  # noqa: E402


async def get_status(path: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /v1/status HTTP/1.1\r\nHost: vsup\r\nConnection: close\r\n\r\n")
    await writer.drain()
    data = await reader.read()
    writer.close()
    if b" 200 " not in data.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"no status through the tunnel: {data[:100]!r}")
    return data


async def timed_status(path: str, n: int = 20) -> tuple[float, float]:
    t0 = time.perf_counter()
    await get_status(path)
    first = time.perf_counter() - t0
    warm = []
    for _ in range(n):
        t0 = time.perf_counter()
        await get_status(path)
        warm.append(time.perf_counter() - t0)
    return first, statistics.median(warm)


def openssh(f: SshFleet, sock: str, rounds: int) -> list[tuple[float, ...]]:
    cfg, cm, local = str(f.ssh_config), str(f.root / "cm"), str(f.root / "o.sock")
    base = ["ssh", "-F", cfg, "-o", "BatchMode=yes", "-o", f"ControlPath={cm}"]
    base += ["-o", "StreamLocalBindUnlink=yes"]
    out: list[tuple[float, ...]] = []
    for _ in range(rounds):
        subprocess.run([*base, "-O", "exit", "a"], capture_output=True)
        t0 = time.perf_counter()
        master = ["-o", "ControlMaster=auto", "-o", "ControlPersist=60", "a", "true"]
        subprocess.run([*base, *master], capture_output=True, check=True)
        t1 = time.perf_counter()
        forward = ["-O", "forward", "-L", f"{local}:{sock}", "a"]
        subprocess.run([*base, *forward], capture_output=True, check=True)
        t2 = time.perf_counter()
        first, warm = asyncio.run(timed_status(local))
        out.append((t1 - t0, t2 - t1, first, warm))
    subprocess.run([*base, "-O", "exit", "a"], capture_output=True)
    return out


def asyncssh_runs(f: SshFleet, sock: str, rounds: int) -> tuple[float, list[tuple[float, ...]]]:
    t0 = time.perf_counter()
    import asyncssh

    imported = time.perf_counter() - t0
    node, local = f.nodes["a"], str(f.root / "a.sock")

    async def once() -> tuple[float, ...]:
        t0 = time.perf_counter()
        conn = await asyncssh.connect(
            "127.0.0.1",
            port=node.port,
            username=os.environ.get("USER") or "root",
            client_keys=[str(f.key)],
            known_hosts=str(f.known_hosts),
        )
        await conn.run("true")
        t1 = time.perf_counter()
        if os.path.exists(local):
            os.unlink(local)
        listener = await conn.forward_local_path(local, sock)
        t2 = time.perf_counter()
        first, warm = await timed_status(local)
        listener.close()
        conn.close()
        await conn.wait_closed()
        return t1 - t0, t2 - t1, first, warm

    return imported, [asyncio.run(once()) for _ in range(rounds)]


def med(runs: list[tuple[float, ...]], i: int) -> float:
    return statistics.median(r[i] for r in runs) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    install_cleanup()
    why = sshd_missing()
    if why:
        print(f"skipped: {why}")
        return 0
    f = SshFleet(["a"]).start()
    try:
        res = f.nodes["a"].vsup("daemon", "--detach")
        if res.returncode != 0:
            raise SystemExit(res.stderr)
        sock = str(f.nodes["a"].home / "vsup.sock")
        figures: dict[str, object] = {}
        o = openssh(f, sock, args.rounds)
        line = "{}: connect+command {:.0f} ms, forward {:.1f} ms, status first {:.1f} ms, "
        line += "warm {:.1f} ms"
        print(line.format("OpenSSH ", *(med(o, i) for i in range(4))))
        figures.update(openssh_connect_ms=med(o, 0), openssh_warm_ms=med(o, 3))
        try:
            imported, a = asyncssh_runs(f, sock, args.rounds)
        except ImportError:
            print("asyncssh: not installed (pip install asyncssh to compare)")
        else:
            print(line.format("asyncssh", *(med(a, i) for i in range(4))))
            print(f"asyncssh: importing it takes {imported * 1000:.0f} ms")
            figures.update(
                asyncssh_import_ms=imported * 1000,
                asyncssh_connect_ms=med(a, 0),
                asyncssh_warm_ms=med(a, 3),
            )
        figures["load"] = os.getloadavg()[0]
        print(last_line(**figures))
    finally:
        f.nodes["a"].down()
        f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
