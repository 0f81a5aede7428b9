"""The router a layout asks for: `[router]` resolved against the layout's instances.

A resolved value like `InstanceSpec` (spec.py), so the compiled layout (compiled.py) carries it;
`vsup.router` re-exports it for the engine and the router's own code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vsup.layout.flags import args_to_flags
from vsup.layout.model import Layout
from vsup.layout.schema import ROUTER_DEFAULTS
from vsup.layout.spec import InstanceSpec, RestartPolicy

WILDCARD_HOSTS = ("0.0.0.0", "", "::")
# vllm-router polls a starting worker list every 30 s by default and binds its port only once
# they all answer /health: a 30 s stall for nothing. vsup hands it ready workers only.
STARTUP_CHECK_INTERVAL_S = 1
# ... and if one of them dies in that instant, the router exits after this long instead of
# waiting its default 600 s; the restart policy then starts it again with the new list.
STARTUP_TIMEOUT_S = 30
# vllm-router retries a request that found no worker, or a refusal, with a backoff (by default
# 5 attempts over about 0.4 s). vsup retries densely over about as long instead: every 4 ms, so
# that a request caught by a remove_worker loop another local user runs (the worker API has no
# authentication, docs/router.md "Who can reach it") finds the member vsup puts back within the
# watch's 0.1 s, however briefly the loop leaves it there. A layout that sets any retry flag
# in `args` gets none of these.
DENSE_RETRIES: dict[str, Any] = {
    "retry-max-retries": 100,
    "retry-initial-backoff-ms": 4,
    "retry-max-backoff-ms": 4,
    "retry-backoff-multiplier": 1.0,
}
# Wake on request (docs/sleep.md): how long a request for a sleeping model is held at most, and
# how many are held per model at once.
HOLD_S = 60.0
HOLD_QUEUE = 256
# A stopped router finishes the requests it is running (its port closes at once) for at most
# this long, then vsup kills it: a restart's gap includes that wait (docs/router.md).
ROUTER_STOP_GRACE_S = 10.0
# What to do when the router's command is not there (a failed start, `vsup validate`).
ROUTER_MISSING_HINT = (
    "vllm-router comes with vsup's router extra: pip install 'vsup[router]' (or set `command` "
    "in the layout's [router] to where it is installed)"
)


@dataclass(frozen=True)
class RouterSpec:
    """One vllm-router process: where it listens and which instances it may route to."""

    port: int
    metrics_port: int
    host: str = "127.0.0.1"  # this node only (docs/router.md: the worker API is open)
    policy: str = "cache_aware"
    model: str | None = None
    command: tuple[str, ...] = ("vllm-router",)
    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    # instance name -> the worker URL the router reaches it at, for the instances it routes to
    workers: Mapping[str, str] = field(default_factory=dict)
    # instance name -> the model its requests name (its served name): several models make the
    # router an inference gateway (`--enable-igw`: each request goes to its model's workers)
    models: Mapping[str, str] = field(default_factory=dict)
    # wake on request (router/holder.py): a held request waits at most hold_s, at most
    # hold_queue are held per model
    hold_s: float = HOLD_S
    hold_queue: int = HOLD_QUEUE

    @property
    def igw(self) -> bool:
        """Whether its workers serve several models (vllm-router's inference-gateway mode)."""
        return len(set(self.models.values())) > 1

    @property
    def listens_everywhere(self) -> bool:
        """A wildcard bind: every address of the node."""
        return self.host in WILDCARD_HOSTS

    @property
    def client_host(self) -> str:
        """Where vsup (and a client on this node) connects: loopback for a wildcard bind."""
        return "127.0.0.1" if self.listens_everywhere else self.host

    @property
    def base_url(self) -> str:
        """The one endpoint to give to clients (from this node)."""
        return f"http://{self.client_host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.client_host}:{self.metrics_port}/metrics"

    def argv(self, worker_urls: Sequence[str] = ()) -> list[str]:
        """The router's command line, starting with `worker_urls` (ready workers only: the
        router binds its port only once every listed worker answers /health). An empty list
        starts it at once with no worker; `RouterMembership` adds them through its API."""
        argv = [
            *self.command,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--policy",
            self.policy,
            # vsup reads and re-exports the figures; the router's own port stays on loopback
            "--prometheus-host",
            self.client_host,
            "--prometheus-port",
            str(self.metrics_port),
        ]
        if self.igw:
            argv.append("--enable-igw")
        args: dict[str, Any] = {
            "worker-startup-check-interval": STARTUP_CHECK_INTERVAL_S,
            "worker-startup-timeout-secs": STARTUP_TIMEOUT_S,
        }
        own = {k.replace("_", "-"): v for k, v in self.args.items()}
        if not any(k.startswith("retry-") or k == "disable-retries" for k in own):
            args.update(DENSE_RETRIES)
        args.update(own)
        argv += args_to_flags(args)
        if worker_urls:
            argv += ["--worker-urls", *worker_urls]
        return argv

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (the daemon's state file keeps the spec a router was started with)."""
        return {
            "port": self.port,
            "metrics_port": self.metrics_port,
            "host": self.host,
            "policy": self.policy,
            "model": self.model,
            "command": list(self.command),
            "args": dict(self.args),
            "env": dict(self.env),
            "restart": asdict(self.restart),
            "workers": dict(self.workers),
            "models": dict(self.models),
            "hold_s": self.hold_s,
            "hold_queue": self.hold_queue,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RouterSpec:
        """The inverse of `to_json`; raises ValueError on a document it cannot rebuild."""
        try:
            return cls(
                port=int(doc["port"]),
                metrics_port=int(doc["metrics_port"]),
                host=str(doc["host"]),
                policy=str(doc["policy"]),
                model=doc.get("model"),
                command=tuple(str(c) for c in doc["command"]),
                args=dict(doc.get("args") or {}),
                env={str(k): str(v) for k, v in (doc.get("env") or {}).items()},
                restart=RestartPolicy(**(doc.get("restart") or {})),
                workers={str(k): str(v) for k, v in (doc.get("workers") or {}).items()},
                models={str(k): str(v) for k, v in (doc.get("models") or {}).items()},
                hold_s=float(doc.get("hold_s", HOLD_S)),
                hold_queue=int(doc.get("hold_queue", HOLD_QUEUE)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"cannot rebuild the router spec ({type(exc).__name__}: {exc})"
            ) from exc

    def same_process(self, other: RouterSpec) -> bool:
        """Whether `other` runs the same router process (only the workers may differ: those
        change through the worker API, never by a restart)."""
        mine = replace(self, workers={}, models={}, hold_s=HOLD_S, hold_queue=HOLD_QUEUE)
        theirs = replace(other, workers={}, models={}, hold_s=HOLD_S, hold_queue=HOLD_QUEUE)
        return mine == theirs and self.igw == other.igw


def router_spec(layout: Layout, specs: Sequence[InstanceSpec]) -> RouterSpec | None:
    """The layout's router, or None when it has no `[router]` table. `specs` are the layout's
    resolved instances; call it on a layout that validated (the keys are not checked here)."""
    table = layout.router
    if table is None:
        return None
    values = {**ROUTER_DEFAULTS, **table}
    model = values.get("model")
    # `model` names the model or the name it is served under (what clients ask the router for)
    members = [s for s in specs if model is None or model in (s.model, s.client_model_name)]
    restart = RestartPolicy(**values["restart"]) if "restart" in values else RestartPolicy()
    return RouterSpec(
        port=values["port"],
        metrics_port=values.get("metrics_port", values["port"] + 1),
        host=values["host"],
        policy=values["policy"],
        model=model,
        command=tuple(values["command"]),
        args=dict(values.get("args", {})),
        env={k: str(v) for k, v in values.get("env", {}).items()},
        restart=restart,
        workers={s.name: s.base_url for s in members},
        models={s.name: s.client_model_name for s in members},
        hold_s=float(values.get("hold_s", HOLD_S)),
        hold_queue=int(values.get("hold_queue", HOLD_QUEUE)),
    )
