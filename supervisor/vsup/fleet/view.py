"""One node as the fleet sees it: a small typed summary of its status snapshot.

`summarize(doc)` reads the node's status JSON through `snapshot.StatusSnapshot.from_json`: the
instances, advice, node, supervisor, router and rollout all typed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vsup.snapshot import RolloutStatus, StatusSnapshot
from vsup.states import RolloutState

SEVERITY_RANK = {"critical": 4, "error": 3, "warning": 2, "info": 1}


@dataclass(frozen=True)
class Alert:
    """One piece of a node's advice (its alerts and hints), with the node's name."""

    node: str
    severity: str
    kind: str
    message: str
    instance: str | None = None


@dataclass(frozen=True)
class NodeView:
    """What `vsup fleet status` shows of one node (`--json`: `to_json()`)."""

    name: str
    ssh: str
    reachable: bool  # SSH got through and the node's vsup answered
    daemon: bool = False  # a vsup daemon answers for the node's VSUP_HOME
    ready: int | None = None
    total: int | None = None
    gpus: int | None = None
    gpu_name: str | None = None
    gpu_vendor: str | None = None
    hostname: str | None = None
    layout: str | None = None
    alerts: int = 0
    worst: Alert | None = None
    router: str | None = None  # the router's endpoint
    router_state: str | None = None
    # generation tokens/s, summed over instances (a span's followers left out: its head's)
    tokens_per_s: float | None = None
    vsup_version: str | None = None
    vllm_version: str | None = None
    rollout: str | None = None  # "running 2/3" | "failed" | "done" | None
    error: str | None = None  # why it is not reachable (SSH's words) or has no daemon
    since: str | None = None  # ISO 8601 UTC: in this state (reachable or not) since
    last_seen: str | None = None  # ISO 8601 UTC: its last answer
    latency_ms: float | None = None  # this query, connection included
    warm: bool | None = None  # the SSH connection was there already
    groups: tuple[str, ...] = ()
    advice: tuple[Alert, ...] = field(default=(), repr=False)

    @property
    def healthy(self) -> bool:
        return (
            self.reachable
            and self.daemon
            and self.ready == self.total
            and not (self.worst is not None and SEVERITY_RANK.get(self.worst.severity, 0) >= 3)
        )

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["groups"] = list(self.groups)
        doc["advice"] = [asdict(a) for a in self.advice]
        return doc


def worst_alert(alerts: tuple[Alert, ...]) -> Alert | None:
    """The most severe alert (the first of equals: the daemon lists the oldest first)."""
    best: Alert | None = None
    for a in alerts:
        if best is None or SEVERITY_RANK.get(a.severity, 0) > SEVERITY_RANK.get(best.severity, 0):
            best = a
    return best


def rollout_text(rollout: RolloutStatus | None) -> str | None:
    """`running 2/3`, `failed`, `done`, or None when the node never rolled."""
    if rollout is None:
        return None
    if rollout.state == RolloutState.RUNNING:
        return f"running {rollout.done}/{rollout.total}"
    return str(rollout.state)


def summarize(
    name: str, ssh: str, doc: dict[str, Any], info: dict[str, Any] | None = None, **extra: Any
) -> NodeView:
    """The node's view from its status JSON (and its `vsup paths` answer for versions)."""
    snap = StatusSnapshot.from_json(doc)
    info = info or {}
    alerts = tuple(Alert(name, a.severity, a.kind, a.message, a.instance) for a in snap.advice)
    # a span's follower reads its head's /metrics (its base URL is the head's): the unit's
    # tokens are counted once, at the head's node
    rates = [
        i.telemetry.generation_tokens_per_s for i in snap.instances if i.span is None or i.span.head
    ]
    known = [r for r in rates if r is not None]
    router = snap.router
    gpu_names = sorted({g.name for g in snap.gpus if g.name})
    return NodeView(
        name=name,
        ssh=ssh,
        reachable=True,
        daemon=True,
        ready=snap.ready_count,
        total=len(snap.instances),
        gpus=snap.node.gpu_count,
        gpu_name=", ".join(gpu_names) or None,
        gpu_vendor=snap.node.gpu_vendor,
        hostname=snap.node.hostname,
        layout=snap.supervisor.layout,
        alerts=len(alerts),
        worst=worst_alert(alerts),
        router=router.endpoint if router is not None else None,
        router_state=router.state if router is not None else None,
        tokens_per_s=round(sum(known), 1) if known else None,
        vsup_version=snap.supervisor.version,
        vllm_version=info.get("vllm_version"),
        rollout=rollout_text(snap.rollout),
        advice=alerts,
        **extra,
    )


def unreachable(
    name: str, ssh: str, why: str, *, reachable: bool = False, **extra: Any
) -> NodeView:
    """A node that did not answer (`reachable` True: SSH works but no daemon answers)."""
    return NodeView(name=name, ssh=ssh, reachable=reachable, error=why, **extra)
