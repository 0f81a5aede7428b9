"""Rules about `span`: one server whose data-parallel ranks live on several nodes (vsup.layout.span;
docs/fleet.md, "One server across nodes").

The keys and their types are the structure checks' (schema.SPAN_KEYS); these rules check what
the values mean: ranks per node, the head among them, the head's address, a size that agrees,
no data-parallel flag in `args` beside the span, a command that knows `--headless`, a model
every node can load by the same name. Whether the nodes are the fleet's is checked where the
fleet file is known (`vsup fleet validate LAYOUT`: span.fleet_problems). The rpc_port's clash
with another port is the data-parallel port rule's (dataparallel.dp_port_clash).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.modelpath import is_local_model
from vsup.layout.parallel import canonical_flag, positive_int
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.span import (
    API_SERVER_MODULE,
    MODEL,
    NODE_NAME_RE,
    SPAN_FLAGS,
    model_sizes,
    read_span,
)
from vsup.layout.spec import is_serve_command

RANKS_EXAMPLE = "ranks = { gpu01 = 2, gpu02 = 2 }"


def _not_a_node_name(node: str) -> str:
    return (
        f"{node!r} is not a node name: the fleet file's names are 1-64 letters, digits, "
        "'.', '_' or '-'"
    )


def _span(m: MergedInstance) -> Mapping[str, Any] | None:
    span = m.values.get("span")
    return span if isinstance(span, Mapping) else None


def span_ranks(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """`ranks`: at least two nodes (by fleet node names), each a positive number of ranks."""
    span = _span(m)
    if span is None or "nodes" in span:
        return []  # a span of nodes (span_nodes)
    ranks = span.get("ranks")
    if not isinstance(ranks, Mapping) or not ranks:
        if ranks is not None and not isinstance(ranks, Mapping):
            return []  # a wrong type: the structure checks said so
        return [
            origin_diag(
                ERROR,
                f"missing: the data-parallel ranks on each node, e.g. {RANKS_EXAMPLE} (fleet "
                "node names; the head first unless head says otherwise)",
                m,
                "span",
                "ranks",
            )
        ]
    out = []
    for node, n in ranks.items():
        if not NODE_NAME_RE.match(node):
            out.append(
                origin_diag(
                    ERROR,
                    _not_a_node_name(node),
                    m,
                    "span",
                    "ranks",
                    node,
                )
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            out.append(
                origin_diag(
                    ERROR,
                    f"must be the number of data-parallel ranks on node '{node}', 1 or more "
                    f"(it is {n!r})",
                    m,
                    "span",
                    "ranks",
                    node,
                )
            )
    if len(ranks) == 1:
        node = next(iter(ranks))
        out.append(
            origin_diag(
                ERROR,
                f"names one node ('{node}'): a span is one server over several nodes; on one "
                "node write args = { data-parallel-size = N } instead",
                m,
                "span",
                "ranks",
            )
        )
    return out


# The keys of one kind of span that the other has not: data parallel (`ranks`) against one
# TP/PP group over the nodes (`nodes`)
DATA_ONLY_KEYS = ("ranks", "rpc_port", "size")
MODEL_ONLY_KEYS = ("master_port",)


def span_nodes(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """`nodes`: one tensor/pipeline parallel group over at least two distinct fleet nodes, in
    node-rank order; not beside the data-parallel keys (vLLM 0.32 would take both, DP groups
    that each span nodes, but vsup writes one or the other); `master_port` only with it."""
    span = _span(m)
    if span is None:
        return []
    nodes = span.get("nodes")
    if nodes is None:
        return [
            origin_diag(
                ERROR,
                f"{key} goes with nodes (one tensor/pipeline parallel group over the nodes); a "
                "span of ranks (data parallel) joins at rpc_port: remove it",
                m,
                "span",
                key,
            )
            for key in MODEL_ONLY_KEYS
            if key in span
        ]
    out = [
        origin_diag(
            ERROR,
            f"{key} and nodes together: ranks (with rpc_port, size) spread data-parallel ranks "
            "over the nodes, nodes one tensor/pipeline parallel group (vLLM's --nnodes); "
            "vsup writes one or the other: remove one",
            m,
            "span",
            key,
        )
        for key in DATA_ONLY_KEYS
        if key in span
    ]
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        return out  # a wrong type: the structure checks said so
    for node in nodes:
        if not NODE_NAME_RE.match(node):
            out.append(
                origin_diag(
                    ERROR,
                    _not_a_node_name(node),
                    m,
                    "span",
                    "nodes",
                )
            )
    twice = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice:
        out.append(
            origin_diag(
                ERROR,
                f"{', '.join(repr(n) for n in twice)} listed more than once: each node runs "
                "one part of the group (its node rank is its place in nodes)",
                m,
                "span",
                "nodes",
            )
        )
    if len(set(nodes)) < 2:
        out.append(
            origin_diag(
                ERROR,
                f"names {len(set(nodes))} node(s): a span is one server over several nodes; on "
                "one node write args = { tensor-parallel-size = N } instead",
                m,
                "span",
                "nodes",
            )
        )
    return out


def span_model_shape(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """A span of nodes: TP x PP (args) is the whole group, `gpus` one node's share of it, so
    TP x PP = len(nodes) x len(gpus); on CPU (no gpus) TP x PP must split evenly over the
    nodes (vLLM: `--nnodes` must evenly divide the world size)."""
    span = _span(m)
    parsed = read_span(span) if span is not None else None
    if parsed is None or parsed.across != MODEL:
        return []
    nnodes = len(parsed.ranks)
    gpus = len(m.gpus or ())
    if model_sizes(m.args, gpus, nnodes) is not None:
        return []
    tp, pp = m.arg("tensor-parallel-size"), m.arg("pipeline-parallel-size")
    if any(v is not None and positive_int(v) is None for v in (tp, pp)):
        return []  # not a positive integer: the parallelism rules said so
    said = " x ".join(
        f"{name} {v}"
        for name, v in (("tensor-parallel-size", tp), ("pipeline-parallel-size", pp))
        if v is not None
    )
    key = m.arg_key("tensor-parallel-size") or m.arg_key("pipeline-parallel-size")
    where: tuple[str, ...] = ("args", key) if key else ("args",)
    if gpus:
        message = (
            f"{said or 'tensor-parallel-size x pipeline-parallel-size'} must be {nnodes} "
            f"nodes x {gpus} GPU(s) = {nnodes * gpus}: the group spans every node, gpus is "
            "one node's share (leave both out for TP = len(gpus), PP = len(nodes))"
        )
    else:
        message = (
            f"{said or 'tensor-parallel-size 1 x pipeline-parallel-size 1'} does not split "
            f"over {nnodes} nodes: a CPU span (gpus = []) gives tensor-parallel-size x "
            f"pipeline-parallel-size, a multiple of the {nnodes} nodes (each runs its share "
            "of the workers)"
        )
    return [origin_diag(ERROR, message, m, *where)]


def span_head(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    span = _span(m)
    if span is None or not isinstance(span.get("head"), str):
        return []
    ranks = span.get("nodes", span.get("ranks"))
    if not isinstance(ranks, (Mapping, list)) or span["head"] in ranks:
        return []
    listed = ", ".join(f"'{n}'" for n in ranks) or "none"
    return [
        origin_diag(
            ERROR,
            f"'{span['head']}' is not one of the span's nodes ({listed}): the head runs ranks "
            f"too; add it to {'nodes' if 'nodes' in span else 'ranks'} or name one of them",
            m,
            "span",
            "head",
        )
    ]


def span_address(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """The head's address: required (vLLM's default is this node's own IP on each node, which
    is the head's on the head only); one word; a loopback one reaches no other machine."""
    span = _span(m)
    if span is None:
        return []
    address = span.get("address")
    if address is None:
        return [
            origin_diag(
                ERROR,
                "missing: the head's address as the other nodes reach it, e.g. address = "
                '"10.0.0.1" (vLLM\'s --data-parallel-address; --master-addr for nodes)',
                m,
                "span",
                "address",
            )
        ]
    if not isinstance(address, str):
        return []  # the structure checks said so
    if not address.strip() or any(c.isspace() for c in address.strip()):
        return [
            origin_diag(ERROR, f"{address!r} is not a host name or address", m, "span", "address")
        ]
    try:
        loopback = ipaddress.ip_address(address.strip()).is_loopback
    except ValueError:
        if ":" in address:
            return [
                origin_diag(
                    ERROR,
                    f"{address!r}: the address alone, without :PORT (the port is rpc_port)",
                    m,
                    "span",
                    "address",
                )
            ]
        loopback = address.strip() == "localhost"
    if not loopback:
        return []
    return [
        origin_diag(
            WARNING,
            f"{address} is loopback: nodes on other machines cannot reach the head there "
            "(fine only when every node of the span is this one machine)",
            m,
            "span",
            "address",
        )
    ]


def span_size(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    span = _span(m)
    parsed = read_span(span) if span is not None else None
    if span is None or parsed is None or not isinstance(span.get("size"), int):
        return []
    if span["size"] == parsed.size:
        return []
    each = " + ".join(str(n) for _, n in parsed.ranks)
    return [
        origin_diag(
            ERROR,
            f"size {span['size']} but the ranks add up to {parsed.size} ({each}): make them "
            "agree (or leave size out: it is the sum)",
            m,
            "span",
            "size",
        )
    ]


def span_flags_in_args(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """A data-parallel flag in `args` would contradict (or repeat) what the span sets."""
    span = _span(m)
    if span is None:
        return []
    nodes = "nodes" in span
    out = []
    for key, value in m.args.items():
        flag = canonical_flag(key)
        if flag not in SPAN_FLAGS or value is False or value is None:
            continue
        keys = (
            "nodes, head, address and master_port" if nodes else "ranks, head, address and rpc_port"
        )
        out.append(
            origin_diag(
                ERROR,
                f"{flag} is set by span on each node (from {keys}): remove it from args",
                m,
                "args",
                key,
            )
        )
    executor = m.arg("distributed-executor-backend")
    if nodes and executor is not None and str(executor) != "mp":
        out.append(
            origin_diag(
                ERROR,
                f"distributed-executor-backend {executor!r}: a span of nodes runs vLLM's mp "
                "executor across them (--nnodes, a headless follower per node); remove it",
                m,
                "args",
                m.arg_key("distributed-executor-backend") or "",
            )
        )
    backend = m.arg("data-parallel-backend")
    if backend is not None and str(backend) != "mp":
        out.append(
            origin_diag(
                ERROR,
                f"data-parallel-backend {backend!r}: a span runs vLLM's mp backend (a headless "
                "follower per node); remove it",
                m,
                "args",
                m.arg_key("data-parallel-backend") or "",
            )
        )
    return out


def span_command(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """Followers run `--headless`, a flag of `vllm serve` only."""
    command = m.values.get("command")
    if _span(m) is None or not isinstance(command, list) or not command:
        return []
    if is_serve_command(command):
        return []
    if "-m" in command and command[command.index("-m") + 1 :][:1] == [API_SERVER_MODULE]:
        return []  # becomes vsup's shim of `vllm serve` (span.serve_command)
    return [
        origin_diag(
            WARNING,
            f"{' '.join(command)!r} is not `vllm serve`: the span's followers run it with "
            "--headless, which only `vllm serve` knows (the API-server module lacks it); "
            'fine if it runs `vllm serve`, else write command = ["vllm", "serve"]',
            m,
            "command",
        )
    ]


def span_model(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """Every node loads the model by the same name: a hub id or an absolute path (as for any
    fleet layout: the nodes get its text, not its directory)."""
    model = m.values.get("model")
    if _span(m) is None or not isinstance(model, str):
        return []
    if not is_local_model(model) or model.startswith(("/", "~")):
        return []
    return [
        origin_diag(
            ERROR,
            f"model '{model}' is a path relative to the layout: every node of a span loads the "
            "model by the same name, so write a hub id (org/name) or an absolute path that "
            "exists on every node",
            m,
            "model",
        )
    ]


def span_with_sleep(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    if _span(m) is None:
        return []
    return [
        origin_diag(
            ERROR,
            f"{key} and span together are not supported: a server over several nodes is not put "
            "to sleep or swapped by vsup; remove one",
            m,
            key,
        )
        for key in ("sleep", "swap_group")
        if m.values.get(key) is not None
    ]
