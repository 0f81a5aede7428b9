"""Rules about data parallel (`--data-parallel-size`): one API server, N engine-core ranks.

What vLLM 0.32 does (vllm/engine/arg_utils.py, vllm/config/parallel.py,
vllm/entrypoints/launchers/dp_supervisor.py):
- internal load balancing (the default on one node): the ranks talk to the API server over local
  IPC; the torch-distributed master port is picked free at start-up (`get_open_ports_list`), so
  two DP instances on one node need no port of their own beyond `--port`. `VLLM_DP_*` variables
  are read only by the offline (SPMD) path, never by `vllm serve` with DP flags.
- `--data-parallel-rpc-port` (default 29550) is bound only when ranks run on other nodes
  (`--data-parallel-size-local` below the size, `--data-parallel-address`, hybrid/external LB).
- external LB (`--data-parallel-external-lb` or `--data-parallel-rank`) is refused for dense
  models ("Non-MoE models do not support external data parallel mode").
- `--data-parallel-hybrid-lb` needs `--data-parallel-size-local`.
- `--data-parallel-multi-port-external-lb`: one API server per local rank on ports
  `port .. port + local - 1` plus an aggregating health server on `--data-parallel-supervisor-port`
  (9256).
"""

from __future__ import annotations

from collections.abc import Iterator

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.parallel import positive_int
from vsup.layout.rules.context import Context, env_flag_on, int_arg, origin_diag, parallelism
from vsup.layout.schema import is_int
from vsup.layout.span import MODEL, read_span

DEFAULT_RPC_PORT = 29550  # vllm.config.ParallelConfig.data_parallel_rpc_port
DEFAULT_SUPERVISOR_PORT = 9256  # FrontendArgs.data_parallel_supervisor_port

# Flags that make the DP group reach beyond this node or this process.
_MULTI_NODE_FLAGS = (
    "data-parallel-address",
    "data-parallel-start-rank",
    "data-parallel-hybrid-lb",
)
_EXTERNAL_LB_FLAGS = ("data-parallel-external-lb", "data-parallel-rank")


def _flag_set(m: MergedInstance, name: str) -> bool:
    value = m.arg(name)
    return value is not None and value is not False


def dp_not_positive(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    out = []
    for name in ("data-parallel-size", "data-parallel-size-local"):
        raw = m.arg(name)
        if raw is None or positive_int(raw) is not None:
            continue
        out.append(
            origin_diag(
                ERROR,
                f"{name} must be a positive integer, not {raw!r}",
                m,
                "args",
                m.arg_key(name) or "",
            )
        )
    size = positive_int(m.arg("data-parallel-size") or 1)
    local = positive_int(m.arg("data-parallel-size-local"))
    if size is not None and local is not None and local > size:
        out.append(
            origin_diag(
                ERROR,
                f"data-parallel-size-local {local} is above data-parallel-size {size}: the local "
                "ranks are part of the group; raise data-parallel-size or lower the local size",
                m,
                "args",
                m.arg_key("data-parallel-size-local") or "",
            )
        )
    return out


def dp_external_lb_dense(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """vLLM refuses external-LB data parallel for a dense model."""
    key = next((k for k in _EXTERNAL_LB_FLAGS if _flag_set(m, k)), None)
    if key is None:
        return []
    info = ctx.model_info(m)
    if info is None or info.is_moe is not False:
        return []
    return [
        origin_diag(
            ERROR,
            f"{key} runs one rank of an external-load-balanced DP group, which vLLM refuses for a "
            "dense (non-MoE) model: run separate instances (one per GPU or TP group) instead",
            m,
            "args",
            m.arg_key(key) or "",
        )
    ]


def dp_hybrid_lb_without_local(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    if not _flag_set(m, "data-parallel-hybrid-lb") or _flag_set(m, "data-parallel-size-local"):
        return []
    return [
        origin_diag(
            ERROR,
            "data-parallel-hybrid-lb needs data-parallel-size-local (the ranks on this node); "
            "vLLM refuses to start without it: add it",
            m,
            "args",
            m.arg_key("data-parallel-hybrid-lb") or "",
        )
    ]


def dp_spans_nodes(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """vsup supervises one node: a DP group with ranks elsewhere lives and dies with them."""
    p = parallelism(m)
    if read_span(m.values.get("span")) is not None:
        return []  # a span: vsup knows every node's part (rules/span.py)
    keys = [k for k in (*_MULTI_NODE_FLAGS, *_EXTERNAL_LB_FLAGS) if _flag_set(m, k)]
    if not (p.shape.spans_nodes or keys):
        return []
    key = m.arg_key(keys[0]) if keys else m.arg_key("data-parallel-size-local")
    return [
        origin_diag(
            WARNING,
            "this data-parallel group has ranks on other nodes: vsup supervises only this node's "
            "part; when a rank elsewhere dies the whole group stops serving, and vsup restarts "
            "only its own part. One node's DP (data-parallel-size alone) is supervised whole",
            m,
            "args",
            key or "",
        )
    ]


def dp_expert_parallel_dense(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    if not env_flag_on(m.arg("enable-expert-parallel", False)):
        return []
    info = ctx.model_info(m)
    if info is None or info.is_moe is not False:
        return []
    return [
        origin_diag(
            WARNING,
            "enable-expert-parallel does nothing for a dense (non-MoE) model: remove it",
            m,
            "args",
            m.arg_key("enable-expert-parallel") or "",
        )
    ]


def dp_moe_without_expert_parallel(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """vLLM's recipes for MoE models (DeepSeek, Qwen3-MoE; on H200 and MI300X alike) pair data
    parallel with expert parallel: without it every rank holds all the experts."""
    p = parallelism(m)
    if p.shape.dp <= 1 or env_flag_on(m.arg("enable-expert-parallel", False)):
        return []
    info = ctx.model_info(m)
    if info is None or not info.is_moe:
        return []
    return [
        origin_diag(
            WARNING,
            f"data-parallel-size {p.shape.dp} on a mixture-of-experts model without "
            "enable-expert-parallel: each rank holds every expert (the weights "
            f"{p.shape.dp} times over); add enable-expert-parallel = true to spread the experts "
            "over the ranks' GPUs",
            m,
            "args",
            m.arg_key("data-parallel-size") or "",
        )
    ]


def dp_env_ignored(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """`VLLM_DP_SIZE`, `VLLM_DP_MASTER_PORT`, ...: only vLLM's offline path reads them."""
    names = sorted(k for k in m.env if k.startswith("VLLM_DP_"))
    return [
        origin_diag(
            WARNING,
            f"vllm serve ignores {name} (only offline data parallel reads it; the master port is "
            "picked free at start-up): use args data-parallel-* flags, or remove it",
            m,
            "env",
            name,
        )
        for name in names
    ]


def _extra_ports(m: MergedInstance) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(port, what binds it, the key that sets it) for the ports a DP instance binds beyond
    `--port` (a span's head binds its `rpc_port`)."""
    p = parallelism(m)
    span = read_span(m.values.get("span"))
    if span is not None and span.across == MODEL:
        what = "its torch.distributed master port (on the span's head)"
        yield span.master_port, what, ("span", "master_port")
        return
    if span is not None:
        yield span.rpc_port, "its data-parallel RPC port (on the span's head)", ("span", "rpc_port")
        return
    reaches_out = p.shape.spans_nodes or any(
        _flag_set(m, k) for k in (*_MULTI_NODE_FLAGS, *_EXTERNAL_LB_FLAGS)
    )
    if reaches_out:
        raw = m.arg("data-parallel-rpc-port")
        port = int_arg(raw) if raw is not None else DEFAULT_RPC_PORT
        if port is not None:
            key = m.arg_key("data-parallel-rpc-port") or ""
            yield port, "its data-parallel RPC port", ("args", key)
    if env_flag_on(m.arg("data-parallel-multi-port-external-lb", False)):
        base = m.values.get("port")
        if is_int(base):
            for rank in range(1, p.shape.dp_local):
                yield base + rank, f"the API server of its DP rank {rank}", ("args",)
        raw = m.arg("data-parallel-supervisor-port")
        port = int_arg(raw) if raw is not None else DEFAULT_SUPERVISOR_PORT
        if port is not None:
            key = m.arg_key("data-parallel-supervisor-port") or ""
            yield port, "its DP supervisor's health server", ("args", key)


def dp_port_clash(ctx: Context) -> list[Diagnostic]:
    """Ports a DP instance binds besides `--port` may not be another instance's (or its own)."""
    taken: dict[int, str] = {}
    for m in ctx.merged:
        port = m.values.get("port")
        if is_int(port):
            taken.setdefault(port, f"the port of instance '{m.label}'")
    listen = ctx.layout.metrics_listen
    if listen:
        taken.setdefault(listen[1], "the metrics exporter's ([layout] metrics_listen)")
    out: list[Diagnostic] = []
    for m in ctx.merged:
        for port, what, key in _extra_ports(m):
            if port in taken:
                out.append(
                    origin_diag(
                        ERROR,
                        f"port {port} is {what} and also {taken[port]}: give one of them "
                        "another port" + (f" ({' '.join(key)})" if any(key[1:]) else ""),
                        m,
                        *key,
                    )
                )
            else:
                taken[port] = f"{what} of instance '{m.label}'"
    return out
