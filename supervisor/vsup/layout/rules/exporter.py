"""Rules for the Prometheus exporter (`[layout] metrics_listen`): it has no authentication, so
what it shows (instance names, models, ports, GPU health) reaches whoever reaches its address."""

from __future__ import annotations

import ipaddress

from vsup.layout.diagnostics import WARNING, Diagnostic
from vsup.layout.rules.context import Context
from vsup.layout.structure import Where

# Addresses that mean "every interface" to bind().
_EVERY_INTERFACE = {"0.0.0.0", "::", ""}


def exporter_not_on_loopback(ctx: Context) -> list[Diagnostic]:
    """`metrics_listen` on every interface (0.0.0.0, ::) or on another address than loopback:
    an unauthenticated exporter open to the network. A warning: a scraper on another host may
    be exactly what is meant, behind a firewall."""
    listen = ctx.layout.metrics_listen
    if listen is None:
        return []
    host, port = listen
    if host in _EVERY_INTERFACE:
        where = f"every interface of this node ({host or 'all'})"
    elif _is_loopback(host):
        return []
    else:
        where = f"{host}, an address other hosts may reach"
    message = (
        f"the Prometheus exporter on port {port} has no authentication and listens on {where}: "
        "anyone who reaches it reads the node's instances, models and GPUs; use "
        f'"127.0.0.1:{port}" and let a local agent forward it, or keep this address behind a '
        "firewall that only admits your Prometheus"
    )
    w = Where(ctx.layout.file, ctx.layout.source_map, ("layout",), table="[layout]")
    return [w.diag(WARNING, message, "metrics_listen", ("metrics_listen",))]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not known to be loopback
