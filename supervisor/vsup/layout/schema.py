"""The keys a layout (and a profile) may hold, their types, and the built-in defaults.

One table of `Key`s per section. The loader keeps whatever the file says; `check_table` is what
turns unknown keys and wrong types into diagnostics. Type checks are strict where a wrong type
would reach vLLM's command line or the restart policy, and lenient where TOML writers differ
(an integer where a float is expected is fine).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeGuard

from vsup.layout.listen import parse_listen
from vsup.layout.spec import (
    CANARY_INSUFFICIENT,
    RESTART_POLICIES,
    SLEEP_LEVELS,
    SLEEP_START,
    InstanceSpec,
    RestartPolicy,
)

# vLLM 0.32's own default for --gpu-memory-utilization (vllm/config/cache.py): what an instance
# that does not set it will take of its GPU.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
# The largest share of one GPU all its instances together may claim: leaves room for the CUDA/HIP
# contexts and the allocator's slack that vLLM's profiling does not see.
MAX_GPU_UTILIZATION_SUM = 0.95

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_int(v: Any) -> TypeGuard[int]:
    """An int, not a bool (TOML's `true` is no count or port)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[int | float]:
    """An int or float, not a bool and not NaN."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def toml_type(v: Any) -> str:
    """The TOML name of a value's type, for messages."""
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, Mapping):
        return "a table"
    return f"a {type(v).__name__}"


@dataclass(frozen=True)
class Key:
    name: str
    # str | bool | int | number | str_list | int_list | table | env_table | restart | profiles
    kind: str
    doc: str
    # extra check on a well-typed value: returns what to change, or None when fine
    check: Callable[[Any], str | None] | None = None


def _positive(v: Any) -> str | None:
    return None if v > 0 else f"must be greater than 0 (it is {v})"


def _not_negative(v: Any) -> str | None:
    return None if v >= 0 else f"must be 0 or more (it is {v})"


def _at_least_one(v: Any) -> str | None:
    return None if v >= 1 else f"must be 1 or more (it is {v})"


def _node_name(v: Any) -> str | None:
    # the fleet file's node names (vsup.fleet.rules.NAME_RE, layout/span.NODE_NAME_RE)
    if re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", v):
        return None
    return f"{v!r} is not a node name: 1-64 letters, digits, '.', '_' or '-'"


def _utilization(v: Any) -> str | None:
    if 0 < v <= 1:
        return None
    return (
        f"must be in (0, 1], a fraction of the GPU's memory (it is {v}); "
        "e.g. 0.9, or 0.45 for two instances on one GPU"
    )


def _port(v: Any) -> str | None:
    if 1 <= v <= 65535:
        return None
    return f"port {v} is out of range: use 1-65535 (vsup's examples use 8000 and up)"


def _name(v: Any) -> str | None:
    if NAME_RE.match(v):
        return None
    return (
        f"name {v!r} is not usable (it names log files): use letters, digits, '.', '_' or '-', "
        "starting with a letter or digit, at most 64 characters"
    )


def _command(v: Any) -> str | None:
    if not v:
        return 'must name the program, e.g. command = ["vllm", "serve"]'
    if any(not s for s in v):
        return "has an empty item: remove it"
    return None


def _policy(v: Any) -> str | None:
    if v in RESTART_POLICIES:
        return None
    close = difflib.get_close_matches(v, RESTART_POLICIES, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown restart policy {v!r}{hint}: use one of " + ", ".join(
        f"'{p}'" for p in RESTART_POLICIES
    )


def _api_key_env(v: Any) -> str | None:
    if ENV_NAME_RE.match(v):
        return None
    return (
        f"{v!r} is not an environment variable name: api_key_env names the variable that holds "
        'the key (e.g. "VLLM_API_KEY"), never the key itself'
    )


def _hf_token_env(v: Any) -> str | None:
    if ENV_NAME_RE.match(v):
        return None
    return (
        f"{v!r} is not an environment variable name: hf_token_env names the daemon's variable "
        'that holds a Hugging Face token (e.g. "HF_TOKEN"), never the token itself'
    )


def _revision(v: Any) -> str | None:
    if v.strip() and not any(c.isspace() for c in v):
        return None
    return 'must name a branch, tag or commit of the hub model, e.g. revision = "main"'


def _metrics_listen(v: Any) -> str | None:
    try:
        parse_listen(v)
    except ValueError as exc:
        return f"{exc} (the Prometheus exporter's address)"
    return None


RESTART_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("policy", "str", "always | on-failure | never", _policy),
        Key("backoff_s", "number", "first delay after the immediate restart", _not_negative),
        Key("backoff_max_s", "number", "the longest delay between restarts", _not_negative),
        Key(
            "stable_s", "number", "seconds of readiness that reset the failure count", _not_negative
        ),
        Key(
            "max_failures",
            "int",
            "consecutive failures before the instance is failed",
            _at_least_one,
        ),
        Key(
            "on_stall",
            "bool",
            "restart a stalled instance (requests, no token for stall_after_s); default false",
        ),
    )
}


def _sleep_level(v: Any) -> str | None:
    if v in SLEEP_LEVELS:
        return None
    return (
        f"must be 1 (weights kept in host RAM: a wake takes seconds) or 2 (weights dropped: a "
        f"wake reloads them from disk), not {v}"
    )


def _sleep_start(v: Any) -> str | None:
    if v in SLEEP_START:
        return None
    return f"must be 'awake' or 'asleep' (what `vsup up` leaves it as once ready), not {v!r}"


SLEEP_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("level", "int", "1: weights to host RAM (default); 2: weights dropped", _sleep_level),
        Key(
            "after_idle_s",
            "number",
            "put it to sleep after this long with no request (0: never, the default)",
            _not_negative,
        ),
        Key("start", "str", "awake | asleep once `vsup up` has it ready", _sleep_start),
        Key(
            "public_dev_mode",
            "bool",
            "accept vLLM's dev-mode endpoints (/sleep, /collective_rpc) on a non-loopback host",
        ),
        Key(
            "recycle_growth_gib",
            "number",
            "restart it while it sleeps once what it keeps asleep grew this many GiB since its "
            "first sleep (0: never, the default)",
            _not_negative,
        ),
    )
}


def _insufficient(v: Any) -> str | None:
    if v in CANARY_INSUFFICIENT:
        return None
    return (
        f"must be 'pass', 'fail' or 'extend' (what a canary with too few requests to compare "
        f"means), not {v!r}"
    )


def _confidence(v: Any) -> str | None:
    if 0.5 <= v < 1:
        return None
    return (
        f"must be from 0.5 up to, not including, 1: how sure the gate must be that a slower "
        f"canary is not noise, e.g. 0.999 (it is {v})"
    )


def _ratio(v: Any) -> str | None:
    return None if v >= 1 else f"must be 1 or more: a ratio to the old instances (it is {v})"


# A rolling apply's canary (docs/canary.md); read into `spec.CanarySettings` (compiled.py).
CANARY_KEYS = (
    Key(
        "canary_s",
        "number",
        "seconds the first wave serves the new spec beside the old before the rest follow "
        "(0, the default: no canary)",
        _not_negative,
    ),
    Key("canary", "int", "instances in the canary wave (default 1)", _at_least_one),
    Key(
        "canary_min_requests",
        "int",
        "requests each side must finish before latencies are compared (default 20)",
        _at_least_one,
    ),
    Key(
        "canary_insufficient",
        "str",
        "pass | fail | extend (default): what too few requests means",
        _insufficient,
    ),
    Key("canary_max_s", "number", "how long 'extend' may watch in all", _positive),
    Key(
        "canary_failed_pct",
        "number",
        "the canary's failed share may exceed the others' by this many points (default 1)",
        _not_negative,
    ),
    Key(
        "canary_min_failed", "int", "fewer failed requests never fail it (default 2)", _at_least_one
    ),
    Key("canary_p50_ratio", "number", "TTFT and ITL p50 limit, x the others' (2)", _ratio),
    Key("canary_p99_ratio", "number", "TTFT and ITL p99 limit, x the others' (2)", _ratio),
    Key(
        "canary_min_delta_ms",
        "number",
        "TTFT differences under this never fail it, ITL under a quarter (20)",
        _not_negative,
    ),
    Key("canary_preemption_ratio", "number", "preemptions/min limit, x the others' (2)", _ratio),
    Key(
        "canary_min_preemptions_per_min",
        "number",
        "fewer preemptions/min never fail it (default 6)",
        _not_negative,
    ),
    Key(
        "canary_warmup_s",
        "number",
        "seconds after the canary is ready whose latencies are not compared (default 10% of "
        "canary_s, 3 s or more, at most a quarter of it)",
        _not_negative,
    ),
    Key(
        "canary_confidence",
        "number",
        "how sure the gate must be that a slower canary is not noise (default 0.999)",
        _confidence,
    ),
)

LAYOUT_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("name", "str", "the layout's name, shown in the dashboard"),
        Key("description", "str", "free text shown beside the name"),
        Key("profiles", "profiles", "profile names, merged in order"),
        Key(
            "metrics_listen", "str", "HOST:PORT of the opt-in Prometheus exporter", _metrics_listen
        ),
        Key(
            "max_unavailable",
            "int",
            "serving instances a rolling apply takes down at a time (default 1)",
            _at_least_one,
        ),
        Key(
            "drain_timeout_s",
            "number",
            "seconds a rolling apply waits for an instance's requests to end before restarting "
            "it (default: the instance's own drain_timeout_s)",
            _positive,
        ),
        Key("empty", "bool", "true: the layout means to run no instance (else that is an error)"),
        Key(
            "node",
            "str",
            "the fleet node this layout is applied on (`vsup fleet up` sets it): which part of "
            "a server across nodes (`span`) runs here",
            _node_name,
        ),
        *CANARY_KEYS,
    )
}

# What `[alerts] kinds` may name (control/alerts.py maps advice and daemon events onto them).
ALERT_KINDS = (
    "crash_loop",
    "failed",
    "preempting",
    "gpu_health",
    "daemon_restarted",
    "stalled",
    "router_foreign_worker",
    "router_worker_removed",
    "canary_rolled_back",
)
SEVERITIES = ("info", "warning", "critical")


def _webhook_env(v: Any) -> str | None:
    if ENV_NAME_RE.match(v):
        return None
    return (
        f"{v!r} is not an environment variable name: webhook_env names the daemon's variable "
        'that holds the webhook URL (e.g. "VSUP_ALERT_WEBHOOK"), never the URL itself'
    )


def _alert_kinds(v: Any) -> str | None:
    unknown = [k for k in v if k not in ALERT_KINDS]
    if not unknown:
        return None
    return f"unknown alert kind {unknown[0]!r}: use any of " + ", ".join(ALERT_KINDS)


def _severity(v: Any) -> str | None:
    return None if v in SEVERITIES else "must be one of " + ", ".join(SEVERITIES)


ALERTS_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("webhook_env", "str", "the daemon's variable holding a webhook URL", _webhook_env),
        Key("command", "str_list", "a program to run per alert (JSON on stdin)", _command),
        Key("kinds", "str_list", "which alerts to send (default: all)", _alert_kinds),
        Key("min_severity", "str", "info | warning (default) | critical", _severity),
        Key(
            "min_interval_s", "number", "seconds before the same alert is sent again", _not_negative
        ),
        Key("resolve_after_s", "number", "seconds clear before 'resolved' is sent", _not_negative),
        Key("resolved", "bool", "send a message when an alert clears (default true)"),
    )
}

COMMON_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("model", "str", "a hub id (org/name) or a local directory (/, ./, ../, ~)"),
        Key("command", "str_list", "how vLLM runs on this node", _command),
        Key("host", "str", "the address vLLM listens on"),
        Key("args", "table", "vLLM flags: max-model-len = 8192 -> --max-model-len 8192"),
        Key(
            "unchecked_args",
            "str_list",
            "args keys not checked against the installed vLLM's flags (a plugin's flag)",
        ),
        Key("env", "env_table", "environment variables for the instance"),
        Key("api_key_env", "str", "the supervisor's variable holding the API key", _api_key_env),
        Key("restart", "restart", "restart policy table"),
        Key("start_timeout_s", "number", "seconds from spawn to /health 200", _positive),
        Key("stop_grace_s", "number", "seconds between SIGTERM and SIGKILL", _not_negative),
        Key("drain_timeout_s", "number", "seconds to wait for running requests", _not_negative),
        Key("health_interval_s", "number", "seconds between /health checks", _positive),
        Key("unhealthy_after", "int", "failed /health checks before unhealthy", _at_least_one),
        Key(
            "unhealthy_grace_s",
            "number",
            "seconds without any /health answer before unhealthy",
            _not_negative,
        ),
        Key(
            "stall_after_s",
            "number",
            "seconds with requests running or waiting and no token processed before the "
            "instance is stalled (0: never)",
            _not_negative,
        ),
        Key(
            "canary_interval_s",
            "number",
            "seconds between the max_tokens = 1 requests vsup sends an idle instance to catch a "
            "frozen engine (0: never, the default)",
            _not_negative,
        ),
        Key(
            "rest_interval_s",
            "number",
            "seconds between the scrapes (and /health reads) of an instance at rest: no request "
            "in flight, no figure moving, no transition (0: every second)",
            _not_negative,
        ),
        Key(
            "gpu_memory_utilization",
            "number",
            "fraction of each GPU's memory the instance may take",
            _utilization,
        ),
        Key("revision", "str", "the hub model's branch, tag or commit to load", _revision),
        Key(
            "hf_token_env",
            "str",
            "the daemon's variable holding a Hugging Face token (gated/private models)",
            _hf_token_env,
        ),
        Key("pull", "bool", "pull the hub model before the start (default true; docs/pull.md)"),
        Key("sleep", "sleep", "vLLM's sleep mode: sleep = { level = 1 } (docs/sleep.md)"),
    )
}

# `span`: one vLLM server whose data-parallel ranks live on several nodes of a fleet
# (docs/fleet.md, "One server across nodes"; vsup.layout.span generates each node's flags).
SPAN_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key(
            "ranks",
            "table",
            "the data-parallel ranks on each node, by fleet node name: { gpu01 = 8, gpu02 = 8 }",
        ),
        Key("head", "str", "the node that runs the API server and rank 0 (default: the first)"),
        Key("address", "str", "the head's address as the other nodes reach it"),
        Key("rpc_port", "int", "the head's data-parallel RPC port (default 29550)", _port),
        Key("size", "int", "the data-parallel size: the sum of ranks (optional)", _at_least_one),
        Key(
            "nodes",
            "str_list",
            "instead of ranks: one tensor/pipeline parallel group over these nodes, in node "
            'rank order: ["gpu01", "gpu02"] (vLLM\'s --nnodes)',
        ),
        Key(
            "master_port",
            "int",
            "with nodes: the head's torch.distributed port (vLLM's --master-port, default 29501)",
            _port,
        ),
    )
}

INSTANCE_ONLY_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("name", "str", "unique instance name", _name),
        Key("gpus", "int_list", "GPU indices; [] for a CPU instance"),
        Key("port", "int", "the port vLLM listens on", _port),
        Key(
            "swap_group",
            "str",
            "instances that time-share their GPUs with sleep mode: one awake at a time",
            _name,
        ),
        Key(
            "span",
            "span",
            "one server whose data-parallel ranks (or tensor/pipeline parallel workers) live "
            "on several fleet nodes (docs/fleet.md)",
        ),
    )
}

INSTANCE_KEYS: dict[str, Key] = {**INSTANCE_ONLY_KEYS, **COMMON_KEYS}
DEFAULTS_KEYS: dict[str, Key] = dict(COMMON_KEYS)

# vllm-router 0.1.17's `--policy` choices (`vllm-router --help`).
ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)
# Flags vsup sets on the router's command line itself, and the [router] key that sets each.
ROUTER_ARGS_OWNED_BY_KEYS = {
    "host": "host",
    "port": "port",
    "policy": "policy",
    "prometheus-port": "metrics_port",
    "prometheus-host": "host",
    "worker-urls": "(the instances: vsup lists them)",
    "enable-igw": "(instances of several models: vsup sets it)",
}


def _router_policy(v: Any) -> str | None:
    if v in ROUTER_POLICIES:
        return None
    close = difflib.get_close_matches(v, ROUTER_POLICIES, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown router policy {v!r}{hint}: use one of " + ", ".join(
        f"'{p}'" for p in ROUTER_POLICIES
    )


ROUTER_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("port", "int", "the one port clients send requests to", _port),
        Key("host", "str", "the address the router listens on (default 127.0.0.1: this node)"),
        Key("metrics_port", "int", "the router's Prometheus port (default: port + 1)", _port),
        Key("policy", "str", "vllm-router's load-balancing policy", _router_policy),
        Key("model", "str", "route only the instances serving this model (default: all)"),
        Key("command", "str_list", "how vllm-router runs on this node", _command),
        Key("args", "table", "more vllm-router flags: retry-max-retries = 3"),
        Key("env", "env_table", "environment variables for the router"),
        Key("restart", "restart", "restart policy table"),
        Key(
            "hold_s",
            "number",
            "wake on request: how long a request for a sleeping model is held at most",
            _positive,
        ),
        Key(
            "hold_queue",
            "int",
            "wake on request: how many requests are held at most per model",
            _at_least_one,
        ),
    )
}
ROUTER_DEFAULTS: dict[str, Any] = {
    # this node only: vllm-router's worker API is open to whoever reaches its port (router.md)
    "host": "127.0.0.1",
    "policy": "cache_aware",  # the router's own default; good for shared prompt prefixes
    "command": ["vllm-router"],
}

# `tune`: the search space of `vsup tune` (vsup/tune/space.py checks it; a run ignores it)
TOP_KEYS = ("layout", "defaults", "instance", "alerts", "router", "tune")
PROFILE_TOP_KEYS = ("profile", "defaults")
PROFILE_HEADER_KEYS: dict[str, Key] = {
    k.name: k for k in (Key("description", "str", "what the profile is for"),)
}

# Flags vsup sets itself from layout keys; an `args` entry for one is refused with the key to use.
ARGS_OWNED_BY_KEYS = {
    "model": "model",
    "host": "host",
    "port": "port",
    "gpu-memory-utilization": "gpu_memory_utilization",
}


def builtin_defaults() -> dict[str, Any]:
    """The bottom of the merge: InstanceSpec's and RestartPolicy's own defaults."""
    spec_defaults = {f.name: f.default for f in fields(InstanceSpec) if f.default is not MISSING}
    restart = {f.name: f.default for f in fields(RestartPolicy)}
    return {
        "command": ["vllm", "serve"],
        "host": "0.0.0.0",
        "args": {},
        "env": {},
        "restart": restart,
        "start_timeout_s": spec_defaults["start_timeout_s"],
        "stop_grace_s": spec_defaults["stop_grace_s"],
        "drain_timeout_s": spec_defaults["drain_timeout_s"],
        "health_interval_s": spec_defaults["health_interval_s"],
        "unhealthy_after": spec_defaults["unhealthy_after"],
        "unhealthy_grace_s": spec_defaults["unhealthy_grace_s"],
        "stall_after_s": spec_defaults["stall_after_s"],
        "canary_interval_s": spec_defaults["canary_interval_s"],
        "rest_interval_s": spec_defaults["rest_interval_s"],
    }


def type_problem(key: Key, value: Any) -> str | None:
    """What is wrong with the type of `value` for `key` (None when the type is right)."""
    kind = key.kind
    if kind == "str":
        ok = isinstance(value, str)
        want = "a string"
    elif kind == "bool":
        ok = isinstance(value, bool)
        want = "a boolean (true or false)"
    elif kind == "int":
        ok = is_int(value)
        want = "an integer"
    elif kind == "number":
        ok = is_number(value)
        want = "a number"
    elif kind in ("str_list", "profiles"):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        want = "an array of strings"
    elif kind == "int_list":
        ok = isinstance(value, list) and all(is_int(v) for v in value)
        want = "an array of integers"
    elif kind in ("table", "env_table", "restart", "sleep", "span"):
        ok = isinstance(value, Mapping)
        want = "a table"
    else:  # pragma: no cover - a Key with an unknown kind is a programming error
        raise ValueError(kind)
    if ok:
        return None
    example = {
        "command": 'command = ["vllm", "serve"]',
        "gpus": "gpus = [0] (or [] for a CPU instance)",
        "profiles": 'profiles = ["rocm-mi300x", "throughput"]',
        "args": "args = { max-model-len = 8192 }",
        "env": 'env = { VLLM_ROCM_USE_AITER = "1" }',
        "restart": 'restart = { policy = "on-failure" }',
        "sleep": "sleep = { level = 1 }",
        "span": 'span = { ranks = { gpu01 = 2, gpu02 = 2 }, address = "10.0.0.1" }',
        "port": "port = 8000",
    }.get(key.name)
    hint = f", e.g. {example}" if example else ""
    return f"must be {want}, not {toml_type(value)}{hint}"


def suggest(name: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None
