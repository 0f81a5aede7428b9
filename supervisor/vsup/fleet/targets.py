"""`vsup fleet prometheus-targets`: Prometheus service discovery for every node's exporter.

One target group per node whose running layout has `[layout] metrics_listen`, in the format
both `file_sd_configs` and `http_sd_configs` read: `[{"targets": ["HOST:PORT"], "labels":
{...}}]`. vsup stores no fleet metrics itself: Prometheus scrapes each node, Grafana shows them
(configs/grafana-vsup.json has a `fleet_node` variable over the `node` label).

Labels: `node` (the fleet file's name), `layout`, `gpu_model`, `gpu_count`, `gpu_vendor`, and
`fleet` when the file names one. (Not `gpu`/`gpu_name`: the exporter's GPU series carry those,
and a target label would rename them.) HOST is the node's `metrics_host`, else the listen address
when it names one, else the host SSH connects to (`ssh -G`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from vsup.fleet.http import NodeClient
from vsup.fleet.model import Node
from vsup.fleet.query import FleetClient

WILDCARDS = ("", "0.0.0.0", "::", "[::]")
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def metrics_listen(toml: str | None) -> tuple[str, int] | None:
    """`[layout] metrics_listen` of a layout's text, as (host, port); None when unset."""
    if not toml:
        return None
    from vsup.layout.model import loads_layout

    try:
        return loads_layout(toml).metrics_listen
    except Exception:  # a layout the node runs is valid; anything else has no exporter to find
        return None


async def ssh_hostname(fc: FleetClient, node: Node) -> str:
    """The host name ssh connects to for the node (`ssh -G`: the ssh config applied)."""
    args = [a for a in fc.transport.base_args(node)]
    proc = await asyncio.create_subprocess_exec(
        *args, "-G", node.ssh, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 10)
    for line in out.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            return value.strip()
    return node.ssh.removeprefix("ssh://").rpartition("@")[2]


async def node_target(fc: FleetClient, node: Node) -> tuple[dict[str, Any] | None, str | None]:
    """(the node's target group or None, a warning or None)."""

    async def read(c: NodeClient) -> tuple[dict[str, Any], dict[str, Any]]:
        return await c.layout(), await c.status()

    try:
        (layout, status), _ = await fc.call(node, read, timeout=fc.fleet.timeout_s * 2)
    except Exception as exc:
        return None, f"{node.name}: left out, not reachable: {exc}"
    listen = metrics_listen(layout.get("toml"))
    if listen is None:
        return None, f"{node.name}: left out, its layout has no [layout] metrics_listen"
    host, port = listen
    warning = None
    if node.metrics_host:
        host = node.metrics_host
    elif host in WILDCARDS:
        host = await ssh_hostname(fc, node)
    elif host in LOOPBACK:
        warning = (
            f"{node.name}: its exporter listens on {host}:{port}, only reachable on the node "
            "itself; set metrics_listen to an address Prometheus reaches, or metrics_host"
        )
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    gpus = status.get("gpus") or []
    names = sorted({g.get("name") for g in gpus if g.get("name")})
    node_info = status.get("node") or {}
    labels = {
        "node": node.name,
        "layout": (status.get("supervisor") or {}).get("layout") or layout.get("name") or "",
        "gpu_model": ", ".join(names),
        "gpu_count": str(node_info.get("gpu_count", len(gpus))),
        "gpu_vendor": str(node_info.get("gpu_vendor") or "none"),
    }
    if fc.fleet.name:
        labels["fleet"] = fc.fleet.name
    return {"targets": [f"{host}:{port}"], "labels": labels}, warning


async def targets(fc: FleetClient, nodes: list[Node]) -> tuple[list[dict[str, Any]], list[str]]:
    """(target groups in the fleet file's order, warnings)."""
    results = await asyncio.gather(*(node_target(fc, n) for n in nodes))
    groups = [g for g, _ in results if g is not None]
    warnings = [w for _, w in results if w]
    return groups, warnings
