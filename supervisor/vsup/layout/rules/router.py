"""Rules about the `[router]` table: its ports, which instances it can route to, and who can
reach it.

The router's keys and types are structure checks (`vsup.layout.structure`); these rules need the
merged instances.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.routerspec import ROUTER_MISSING_HINT
from vsup.layout.rules.context import Context
from vsup.layout.rules.dataparallel import _extra_ports as extra_ports
from vsup.layout.schema import ROUTER_DEFAULTS, is_int
from vsup.layout.spec import served_name
from vsup.layout.vllm_flags import instance_path


def _diag(ctx: Context, message: str, key: str | None, severity: str = ERROR) -> Diagnostic:
    return Diagnostic(
        severity,
        message,
        file=ctx.layout.file,
        line=(key and ctx.layout.line("router", key)) or ctx.layout.line("router"),
        key=key,
        table="[router]",
    )


def router_ports(ctx: Context) -> list[Diagnostic]:
    """The router's port and metrics port are its own: no instance, no exporter, not each other."""
    router = ctx.layout.router
    if router is None:
        return []
    port = router.get("port")
    if not is_int(port):
        return []  # missing or mistyped: a structure error says so
    metrics_port = router.get("metrics_port", port + 1)
    taken: dict[int, str] = {}
    for m in ctx.merged:
        p = m.values.get("port")
        if is_int(p):
            taken.setdefault(p, f"instance '{m.label}'")
        for extra, what, _key in extra_ports(m):
            taken.setdefault(extra, f"{what} (instance '{m.label}')")
    listen = ctx.layout.metrics_listen
    if listen:
        taken.setdefault(listen[1], "the metrics exporter ([layout] metrics_listen)")
    out: list[Diagnostic] = []
    for key, value in (("port", port), ("metrics_port", metrics_port)):
        if not is_int(value):
            continue
        implicit = key == "metrics_port" and "metrics_port" not in router
        if value in taken:
            fix = f"set metrics_port to a free port (it defaults to port + 1 = {value})"
            out.append(
                _diag(
                    ctx,
                    f"the router's {key.replace('_', ' ')} {value} is also used by "
                    f"{taken[value]}: " + (fix if implicit else "give the router its own port"),
                    key,
                )
            )
    if is_int(metrics_port) and metrics_port == port:
        out.append(_diag(ctx, f"metrics_port {port} is the router's port: use another", "port"))
    return out


def router_models(ctx: Context) -> list[Diagnostic]:
    """`model` must name a model an instance serves. Without it the router fronts every
    instance; instances of several models make it an inference gateway (vllm-router's
    `--enable-igw`): each request goes to the instances of the model it names."""
    router = ctx.layout.router
    if router is None:
        return []
    # each instance's model as written, and the name its clients ask for (served-model-name):
    # `model` may give either
    named: list[tuple[str, str]] = []
    for m in ctx.merged:
        model = m.values.get("model")
        if isinstance(model, str):
            named.append((model, served_name(m.args) or model))
    wanted = router.get("model")
    if isinstance(wanted, str) and named and not any(wanted in n for n in named):
        shown = ", ".join(f"'{x}'" for x in sorted({x for n in named for x in n}))
        return [_diag(ctx, f"no instance serves model '{wanted}': use one of {shown}", "model")]
    return []


def _loopback(host: str) -> bool:
    return host == "localhost" or host == "::1" or host.startswith("127.")


def router_reachable(ctx: Context) -> list[Diagnostic]:
    """A router on an address other hosts reach exposes vllm-router's worker API with it: it
    has no authentication (docs/router.md), so anyone who reaches the port can add a server of
    their own as a worker and get a share of the requests. vsup removes such workers at once
    and raises advice, but cannot refuse them: say so where the layout opens it."""
    router = ctx.layout.router
    if router is None or not isinstance(router.get("host"), str):
        return []  # the default is loopback; a mistyped host is a structure error
    host = router["host"]
    if _loopback(host):
        return []
    port = router.get("port")
    where = f"{host}:{port}" if is_int(port) else host
    return [
        _diag(
            ctx,
            f"the router listens on {where}: its worker API (POST /add_worker) has no "
            "authentication, so anyone who reaches that port can add a server of their own and "
            "get a share of the requests (vsup removes such a worker within a second and raises "
            'advice router_foreign_worker, but cannot refuse it). Keep host = "127.0.0.1" (the '
            "default) behind a proxy, or firewall the port to the clients that need it",
            "host",
            WARNING,
        )
    ]


def router_command_not_found(ctx: Context) -> list[Diagnostic]:
    """The router's command is not on this node (the `router` extra not installed): its start
    would fail. Only a warning: layouts are often checked on another machine than the one
    they run on."""
    router = ctx.layout.router
    if router is None:
        return []
    command = router.get("command", ROUTER_DEFAULTS["command"])
    if not (isinstance(command, list) and command and isinstance(command[0], str)):
        return []  # a structure error says so
    program = command[0]
    if not program or shutil.which(program, path=instance_path()) or Path(program).is_file():
        return []
    return [
        _diag(
            ctx,
            f"the router's command '{program}' is not found on this node (fine if this layout "
            f"is for another node): {ROUTER_MISSING_HINT}",
            "command",
            WARNING,
        )
    ]
