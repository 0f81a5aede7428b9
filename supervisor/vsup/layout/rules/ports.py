"""Rules about the ports instances listen on."""

from __future__ import annotations

from collections.abc import Iterator

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.schema import is_int


def _with_ports(ctx: Context) -> Iterator[tuple[MergedInstance, int]]:
    for m in ctx.merged:
        port = m.values.get("port")
        if is_int(port) and 1 <= port <= 65535:  # out of range is a structure error
            yield m, port


def port_used_twice(ctx: Context) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    by_port: dict[int, MergedInstance] = {}
    for m, port in _with_ports(ctx):
        if port in by_port:
            out.append(
                origin_diag(
                    ERROR,
                    f"port {port} is also used by instance '{by_port[port].label}': give each "
                    "instance its own port",
                    m,
                    "port",
                )
            )
        else:
            by_port[port] = m
    return out


def port_of_metrics_exporter(ctx: Context) -> list[Diagnostic]:
    listen = ctx.layout.metrics_listen
    if not listen:
        return []
    return [
        origin_diag(
            ERROR,
            f"port {port} is also the metrics exporter's ([layout] metrics_listen): change one",
            m,
            "port",
        )
        for m, port in _with_ports(ctx)
        if port == listen[1]
    ]


def port_privileged(ctx: Context) -> list[Diagnostic]:
    return [
        origin_diag(
            WARNING,
            f"port {port} is privileged: vLLM needs root to bind it; use 1024 or above",
            m,
            "port",
        )
        for m, port in _with_ports(ctx)
        if port < 1024
    ]
