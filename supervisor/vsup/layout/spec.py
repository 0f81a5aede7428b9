"""The resolved, ready-to-run description of one instance: what the engine consumes.

The layout model (model.py) merges built-in defaults <- profiles (in order) <- `[defaults]` <-
`[[instance]]` into one `InstanceSpec` per instance. The engine never reads TOML.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vsup.layout.flags import args_to_flags, flag_name
from vsup.layout.parallel import TP_FLAG, ParallelShape, find_arg, parallel_shape
from vsup.snapshot import rank_words

RESTART_POLICIES = ("always", "on-failure", "never")

# vLLM's switch for `GET /load` (its API server's count of requests in flight), which stall
# detection reads (telemetry/stall.py); vsup adds it where the vLLM knows it (layout/resolve.py).
LOAD_TRACKING_FLAG = "--enable-server-load-tracking"

# Environment variables removed from every child: vLLM on ROCm reads CUDA_VISIBLE_DEVICES, and
# HIP_VISIBLE_DEVICES beside it renumbers devices a second time.
REMOVED_ENV = ("HIP_VISIBLE_DEVICES",)
# The variables huggingface_hub reads a token from: a pulled instance runs offline and gets
# none of them (nor the one `hf_token_env` names): the model's remote code could read it.
HUB_TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SERVED_NAME_FLAG = "--served-model-name"
SHIM_MODULE = "vsup.vllmserve"
# `python -m X serve ...` forms that are vLLM's own CLI (`vllm serve`)
SERVE_MODULES = ("vllm.entrypoints.cli.main", SHIM_MODULE)


def is_serve_command(command: Sequence[str]) -> bool:
    """Whether `command` is vLLM's own CLI before `serve` (`vllm serve`, `python -m
    vllm.entrypoints.cli.main serve`, vsup's shim): the forms that know `--headless`."""
    words = list(command)
    if len(words) >= 2 and os.path.basename(words[0]) == "vllm" and words[1] == "serve":
        return True
    if "-m" in words:
        i = words.index("-m")
        return words[i + 1 : i + 3] in ([m, "serve"] for m in SERVE_MODULES)
    return False


def served_name(args: Mapping[str, Any]) -> str | None:
    """The first name an `args` table's --served-model-name gives (vLLM answers to each, and
    names the model by the first), or None when it sets none."""
    found = find_arg(args, SERVED_NAME_FLAG)
    served = found[1] if found else None
    if isinstance(served, list | tuple):
        served = served[0] if served else None
    if served is None or isinstance(served, bool):
        return None
    name = str(served).split()
    return name[0] if name else None


@dataclass(frozen=True)
class RestartPolicy:
    policy: str = "on-failure"  # always | on-failure | never
    backoff_s: float = 10.0
    backoff_max_s: float = 300.0
    stable_s: float = 600.0
    max_failures: int = 5
    # restart a stalled instance (requests but no token for stall_after_s) like a failed one
    on_stall: bool = False


CANARY_INSUFFICIENT = ("pass", "fail", "extend")


@dataclass(frozen=True)
class CanarySettings:
    """A rolling apply's canary (`[layout] canary_s`, `canary`, `canary_*`; docs/canary.md):
    the first wave serves the new spec for `watch_s` seconds beside the old instances and a
    gate on vLLM's own figures (engine/canary.py) decides whether the rollout goes on."""

    watch_s: float = 0.0  # 0: no canary (a plain rolling apply)
    instances: int = 1  # instances in the first wave
    min_requests: int = 20  # finished requests each side needs before latencies are compared
    insufficient: str = "extend"  # pass | fail | extend: what too few requests means
    max_s: float | None = None  # how long `extend` may watch in all; None: 4 x watch_s
    failed_pct: float = 1.0  # the canary's failed share may exceed the others' by this (points)
    min_failed: int = 2  # fewer failed canary requests than this never fail it
    p50_ratio: float = 2.0  # TTFT and ITL p50 at most this times the others'
    p99_ratio: float = 2.0  # TTFT and ITL p99 at most this times the others'
    min_delta_ms: float = 20.0  # latency differences smaller than this never fail it
    preemption_ratio: float = 2.0  # preemptions/min at most this times the others' (per inst.)
    min_preemptions_per_min: float = 6.0  # below this the canary's preemptions never fail it
    # seconds after the canary is ready whose requests' latencies are not compared (a fresh
    # server's first requests are slow: compilation, caches); None: `warmup_default`
    warmup_s: float | None = None
    # how sure the gate must be that a latency over the ratio is the canary's and not noise
    # (a one-sided test on the requests above a bucket bound, engine/canary.py)
    confidence: float = 0.999

    @property
    def enabled(self) -> bool:
        return self.watch_s > 0

    def min_delta_for(self, attr: str) -> float:
        """The floor in ms under which a latency difference never fails the canary: TTFT's is
        `min_delta_ms`; ITL's a quarter of it (a GPU's inter-token latency is a few ms: with
        TTFT's 20 ms an eager canary's p99 ITL of 24.5 vs 9.9 ms, 2.5x, passed on an H100;
        docs/gpu-runs/2026-12-06-h100-canary). The evidence rule keeps either from noise."""
        return self.min_delta_ms / 4 if attr == "itl" else self.min_delta_ms

    @property
    def warmup(self) -> float:
        """The warm-up in seconds: `warmup_s`, else 10% of `watch_s`, at least 3 s but at most
        a quarter of the watch."""
        if self.warmup_s is not None:
            return self.warmup_s
        return min(max(0.1 * self.watch_s, 3.0), 0.25 * self.watch_s)

    @property
    def limit_s(self) -> float:
        """The longest watch: `max_s` for `extend`, else `watch_s`."""
        if self.insufficient != "extend":
            return self.watch_s
        return self.max_s if self.max_s is not None else 4 * self.watch_s


# vLLM's sleep mode (docs/sleep.md): the flag that turns it on, and the variable that exposes
# /sleep, /wake_up, /is_sleeping and /collective_rpc (vLLM's dev-mode endpoints).
SLEEP_MODE_FLAG = "--enable-sleep-mode"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
SLEEP_LEVELS = (1, 2)
SLEEP_START = ("awake", "asleep")


@dataclass(frozen=True)
class SleepSpec:
    """An instance's `sleep` table: it may be put to sleep (vLLM's sleep mode).

    level 1 moves its weights to host RAM (a wake copies them back: seconds); level 2 drops
    them (a wake reloads them from disk). `after_idle_s` > 0: vsup puts it to sleep after that
    long with no request. `start`: whether `vsup up` leaves it awake or asleep once ready (None:
    awake, except in a swap group, where only the group's first member in layout order starts
    awake). `public_dev_mode`: the layout accepts vLLM's dev-mode endpoints on a host other
    than loopback (refused otherwise). `recycle_growth_gib` > 0: once what it keeps asleep grew
    that much since its process's first sleep, vsup restarts it while it sleeps (docs/sleep.md,
    "What sleep leaves behind")."""

    level: int = 1
    after_idle_s: float = 0.0
    start: str | None = None
    public_dev_mode: bool = False
    recycle_growth_gib: float = 0.0


@dataclass(frozen=True)
class SpanRole:
    """This node's part of one server spanning nodes (layout/span.py; docs/fleet.md, "One
    server across nodes"): which node it is, head or follower, its ranks, and where the rest of
    the unit lives (every node's ranks in rank order, the head first; the head's address, its
    data-parallel RPC port and its API server's port)."""

    node: str
    head: bool
    start_rank: int
    ranks: int
    members: tuple[tuple[str, int], ...]
    address: str
    rpc_port: int
    port: int
    # "data": `ranks` are data-parallel ranks; "model" (a span of `nodes`): the workers of one
    # tensor/pipeline parallel group, `rpc_port` the head's torch.distributed master port
    across: str = "data"

    @property
    def size(self) -> int:
        return sum(n for _, n in self.members)

    @property
    def head_node(self) -> str:
        return self.members[0][0]

    def node_of(self, rank: int) -> str | None:
        """The node that runs data-parallel `rank`; None out of range."""
        start = 0
        for node, n in self.members:
            if start <= rank < start + n:
                return node
            start += n
        return None

    def describe(self) -> str:
        """`head, rank 0 of 2` / `ranks 2-3 of 4, head gpu01 at 10.0.0.1:8000`."""
        which = rank_words(self.start_rank, self.ranks, self.across)
        if self.head:
            return f"head, {which} of {self.size}"
        return f"{which} of {self.size}, head {self.head_node} at {self.address}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "head": self.head,
            "start_rank": self.start_rank,
            "ranks": self.ranks,
            "members": [[node, n] for node, n in self.members],
            "address": self.address,
            "rpc_port": self.rpc_port,
            "port": self.port,
            "across": self.across,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SpanRole:
        return cls(
            node=str(doc["node"]),
            head=bool(doc["head"]),
            start_rank=int(doc["start_rank"]),
            ranks=int(doc["ranks"]),
            members=tuple((str(node), int(n)) for node, n in doc["members"]),
            address=str(doc["address"]),
            rpc_port=int(doc["rpc_port"]),
            port=int(doc["port"]),
            across=str(doc.get("across", "data")),
        )


@dataclass(frozen=True)
class InstanceSpec:
    name: str
    model: str
    command: tuple[str, ...]
    host: str
    port: int
    gpus: tuple[int, ...]
    gpu_memory_utilization: float | None
    args: Mapping[str, Any] = field(default_factory=dict)  # flags beyond the reserved ones
    env: Mapping[str, str] = field(default_factory=dict)
    api_key_env: str | None = None  # the daemon's variable holding the key; never the key
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    start_timeout_s: float = 900.0
    stop_grace_s: float = 30.0
    drain_timeout_s: float = 60.0
    health_interval_s: float = 1.0
    unhealthy_after: int = 3  # consecutive failed /health checks of a live process
    # ...and, when /health gave no answer at all (timeouts: a saturated API server), this long
    # since its last answer: a busy server is not a hung one, and a restart costs minutes
    unhealthy_grace_s: float = 30.0
    # requests running or waiting and no token processed this long, /health still 200: the
    # instance is `stalled` (telemetry/stall.py); 0 turns the detection off
    stall_after_s: float = 60.0
    # an idle instance gets one max_tokens = 1 request this often, answered within
    # stall_after_s or it is stalled (telemetry/stall.py); 0: never
    canary_interval_s: float = 0.0
    # at rest (nothing in flight, nothing moving: telemetry/rest.py) it is scraped, and its
    # /health read, this often instead of every poll; 0: every poll
    rest_interval_s: float = 3.0
    # --enable-server-load-tracking on its command line: vsup reads its /load. False for a spec
    # built by hand or kept from a vsup that did not add it (the process runs without it).
    load_tracking: bool = False
    profiles: tuple[str, ...] = ()
    # A hub model (docs/pull.md): the revision (branch, tag or commit) every replica loads; the
    # daemon's variable holding a Hugging Face token (never the token); whether vsup pulls it
    # into the cache before the start (False: vLLM downloads it itself, as without vsup).
    revision: str | None = None
    hf_token_env: str | None = None
    pull: bool = True
    # Set by the daemon, never by a layout: the local snapshot a pull left in the cache. vLLM
    # then loads it offline (HF_HUB_OFFLINE=1) under the model's name (--served-model-name).
    model_path: str | None = None
    # vLLM's sleep mode (docs/sleep.md): None unless the layout gives the instance a `sleep`
    # table; `swap_group`: instances that time-share their GPUs, at most one awake at a time.
    sleep: SleepSpec | None = None
    swap_group: str | None = None
    # This node's part of a server across nodes (layout/span.py); None for any other instance.
    # A follower (headless: no API server of its own) is reached through its head: its health,
    # base URL and readiness are the head's, and it binds no port here.
    span: SpanRole | None = None

    @property
    def follower(self) -> bool:
        """A headless member of a span: it runs ranks and no API server."""
        return self.span is not None and not self.span.head

    @property
    def devices(self) -> tuple[str, ...]:
        """Device keys for start ordering: one per GPU; CPU instances share the key "cpu"."""
        return tuple(f"gpu{g}" for g in self.gpus) if self.gpus else ("cpu",)

    @functools.cached_property
    def parallel(self) -> ParallelShape:
        """TP x PP x DP as this instance runs them (see vsup.layout.parallel); worked out
        once per spec (the daemon reads it for every instance every second)."""
        return parallel_shape(self.args, len(self.gpus))

    @property
    def tensor_parallel_size(self) -> int:
        return self.parallel.tp

    @property
    def data_parallel_size(self) -> int:
        """DP ranks (engine cores) behind this instance's one API server; 1 without DP."""
        return self.parallel.dp

    @property
    def health_url(self) -> str:
        return f"http://{self.client_host}:{self.port}/health"

    @property
    def command_hint(self) -> str:
        """What to do when its command cannot be run (no such file, not executable)."""
        return f"fix `command` of instance {self.name!r} in the layout"

    @property
    def start_poll_s(self) -> float:
        """How often readiness is checked while it starts (the health interval for vLLM)."""
        return self.health_interval_s

    @property
    def base_url(self) -> str:
        return f"http://{self.client_host}:{self.port}"

    @property
    def client_host(self) -> str:
        """Where vsup itself connects: loopback when the server listens on every address; a
        span's follower: its head's address (the API server of the unit)."""
        if self.span is not None and not self.span.head:
            return self.span.address
        if self.host in ("0.0.0.0", "", "::"):
            return "127.0.0.1"
        return self.host

    def argv(self) -> list[str]:
        """The vLLM command line. The API key is never in it (see `child_env`)."""
        model = self.model_path or self.model
        argv = [*self.command, "--model", model, "--host", self.host, "--port", str(self.port)]
        if self.gpus and self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", repr(float(self.gpu_memory_utilization))]
        if self.load_tracking and find_arg(self.args, LOAD_TRACKING_FLAG) is None:
            argv.append(LOAD_TRACKING_FLAG)
        if self.sleep is not None and self.gpus and find_arg(self.args, SLEEP_MODE_FLAG) is None:
            # vLLM's CPU build refuses the flag ("Sleep mode is not supported on current
            # platform", 0.32) and serves /sleep with dev mode alone (its sleep frees nothing)
            argv.append(SLEEP_MODE_FLAG)
        args = dict(self.args)
        if self.model_path:
            # clients keep asking for the hub id, not the snapshot's path; the layout's own
            # served-model-name wins (however its key is spelled)
            if find_arg(args, SERVED_NAME_FLAG) is None:
                args["served-model-name"] = self.model
        elif self.revision and find_arg(args, "--revision") is None:
            args["revision"] = self.revision
        shape = self.parallel
        # The TP size follows from the GPUs: all of them, or each DP rank's (and PP stage's)
        # share. Writing --tensor-parallel-size len(gpus) beside --data-parallel-size N would ask
        # for N x len(gpus) GPUs.
        if shape.tp > 1 and find_arg(args, TP_FLAG) is None:
            args["tensor-parallel-size"] = shape.tp
        argv += args_to_flags(args)
        n = len(self.command)
        if self.span is not None and is_serve_command(self.command):
            # a span's member runs `vllm serve`: the model as its positional argument
            argv = [*argv[:n], argv[n + 1], *argv[n + 2 :]]
        return argv

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the instance runs with: `base` (the daemon's), then the layout's
        env, pinned to its GPUs, HIP_VISIBLE_DEVICES removed, the API key by name only; pulled
        (`model_path`): offline, without HF_TOKEN, HUGGING_FACE_HUB_TOKEN and `hf_token_env`."""
        env = dict(os.environ if base is None else base)
        env.update({k: str(v) for k, v in self.env.items()})
        removed: tuple[str, ...] = REMOVED_ENV
        if self.model_path:
            # pulled: the daemon's token variables (inherited) stay out of the model's process
            removed += HUB_TOKEN_ENV + ((self.hf_token_env,) if self.hf_token_env else ())
        for key in removed:
            env.pop(key, None)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # A CPU instance (gpus = []) sees no GPU at all rather than every GPU.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        if self.sleep is not None:
            env[DEV_MODE_ENV] = "1"  # /sleep and /wake_up are dev-mode endpoints
        if self.api_key_env:
            secret = (base if base is not None else os.environ).get(self.api_key_env)
            if secret:
                env["VLLM_API_KEY"] = secret
        if self.model_path:
            # pulled: every file is in the snapshot, so no replica asks the hub (nor needs a token)
            env["HF_HUB_OFFLINE"] = "1"
        elif self.hf_token_env:
            token = (base if base is not None else os.environ).get(self.hf_token_env)
            if token:
                env["HF_TOKEN"] = token
        return env

    @functools.cached_property
    def served_model_name(self) -> str | None:
        """The name clients ask vLLM for when it is not the `model` value: the first
        `--served-model-name`, or the hub id of a model loaded from its pulled snapshot
        (once per spec: the daemon's status reads it for every instance every second)."""
        return served_name(self.args) or (self.model if self.model_path else None)

    @property
    def client_model_name(self) -> str:
        """The model name a request to this instance carries (what `/v1/models` lists first):
        the served name, else the `model` value vLLM was given."""
        return self.served_model_name or self.model

    def arg(self, name: str, default: Any = None) -> Any:
        want = flag_name(name)
        for k, v in self.args.items():
            if flag_name(k) == want:
                return v
        return default
