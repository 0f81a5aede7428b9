"""vllm-router in front of the instances: its spec and command line, a client for its worker
API and metrics, and the membership logic that keeps its worker set equal to vsup's ready
instances. No engine, control or UI code: the engine drives it (see docs/router.md)."""

# the spec is resolved from the layout like an InstanceSpec: it lives in the layout package
from vsup.layout.routerspec import (
    ROUTER_MISSING_HINT,
    ROUTER_STOP_GRACE_S,
    RouterSpec,
    router_spec,
)
from vsup.router.client import RouterClient, RouterError, RouterMetrics, parse_router_metrics
from vsup.router.membership import (
    EXCLUDED,
    ForeignWorker,
    MembershipChange,
    RemovedWorker,
    RouterMembership,
)

__all__ = [
    "EXCLUDED",
    "ROUTER_MISSING_HINT",
    "ROUTER_STOP_GRACE_S",
    "ForeignWorker",
    "MembershipChange",
    "RemovedWorker",
    "RouterClient",
    "RouterError",
    "RouterMembership",
    "RouterMetrics",
    "RouterSpec",
    "parse_router_metrics",
    "router_spec",
]
