"""The router as the engine runs it: its process spec and the states membership reads (the
real binary: tests/integration/engine/test_router.py)."""

from __future__ import annotations

from pathlib import Path

from vsup.engine import Engine
from vsup.engine.routing import ROUTER_NAME, process_spec
from vsup.layout.spec import RestartPolicy
from vsup.router import RouterSpec

from tests.support.clock import FakeClock

SPEC = RouterSpec(
    port=8080,
    metrics_port=8081,
    host="0.0.0.0",
    policy="round_robin",
    command=("vllm-router",),
    env={"RUST_LOG": "info"},
    restart=RestartPolicy(policy="always"),
    workers={"a": "http://127.0.0.1:8000"},
)


def test_the_router_runs_as_a_spec_of_its_own_kind():
    spec = process_spec(SPEC)
    assert spec.name == ROUTER_NAME and spec.restart.policy == "always"
    assert spec.argv()[:2] == ["vllm-router", "--host"] and "--worker-urls" not in spec.argv()
    assert spec.health_url == "http://127.0.0.1:8080/liveness"
    assert spec.devices == ("router",)  # never waits for a vLLM start
    assert spec.child_env({"PATH": "/bin"}) == {"PATH": "/bin", "RUST_LOG": "info"}


def test_no_router_is_null_in_the_status(tmp_path: Path):
    assert Engine(FakeClock(), tmp_path).router.status_json() is None


def test_a_ready_instance_flagged_by_exclude_is_no_worker():
    from types import SimpleNamespace

    from vsup.engine.routing import RouterSupervisor

    engine = SimpleNamespace(
        instances={n: SimpleNamespace(state=s) for n, s in (("a", "ready"), ("b", "ready"))}
    )
    sup = RouterSupervisor(engine)
    sup.exclude = lambda name: name == "a"  # stalled, say
    assert sup.states() == {"a": "excluded", "b": "ready"}
