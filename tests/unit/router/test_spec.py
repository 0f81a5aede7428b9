"""The router's spec from a layout, and its command line."""

from __future__ import annotations

from vsup.layout.model import loads_layout
from vsup.router import router_spec

LAYOUT = """\
[defaults]
model = "org/a"
command = ["vllm", "serve"]

[[instance]]
name = "a0"
gpus = [0]
port = 8000

[[instance]]
name = "b0"
gpus = [1]
port = 8001
model = "org/b"
host = "127.0.0.2"

[[instance]]
name = "a1"
gpus = [2]
port = 8002

[router]
port = 8080
model = "org/a"
args = { retry_max_retries = 2, disable-circuit-breaker = true }
restart = { policy = "always" }
"""


def spec_of(text: str):
    layout = loads_layout(text)
    return router_spec(layout, layout.resolve())


def test_the_router_routes_to_the_instances_of_its_model_in_layout_order():
    spec = spec_of(LAYOUT)
    assert spec.workers == {"a0": "http://127.0.0.1:8000", "a1": "http://127.0.0.1:8002"}
    assert (spec.port, spec.metrics_port, spec.host, spec.policy) == (
        8080,
        8081,
        "127.0.0.1",  # loopback unless the layout says otherwise: the worker API is open
        "cache_aware",
    )
    assert spec.base_url == "http://127.0.0.1:8080"
    assert spec.metrics_url == "http://127.0.0.1:8081/metrics"
    assert spec.restart.policy == "always"
    assert spec.restart.backoff_s == 10.0


def test_without_a_model_every_instance_is_a_worker():
    spec = spec_of(LAYOUT.replace('model = "org/a"\nargs', "args"))
    assert list(spec.workers) == ["a0", "b0", "a1"]
    assert spec.workers["b0"] == "http://127.0.0.2:8001"


def test_argv_sets_ports_policy_and_fast_startup_checks_then_args_then_workers():
    spec = spec_of(LAYOUT)
    argv = spec.argv(["http://127.0.0.1:8000"])
    assert argv[:11] == [
        "vllm-router",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--policy",
        "cache_aware",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "8081",
    ]
    rest = argv[11:]
    assert rest[rest.index("--worker-startup-check-interval") + 1] == "1"
    assert rest[rest.index("--retry-max-retries") + 1] == "2"
    assert "--disable-circuit-breaker" in rest
    assert rest[-2:] == ["--worker-urls", "http://127.0.0.1:8000"]
    assert "--worker-urls" not in spec.argv([])


def test_args_may_override_the_startup_defaults():
    spec = spec_of(LAYOUT.replace("retry_max_retries = 2", "worker-startup-timeout-secs = 5"))
    argv = spec.argv()
    assert argv.count("--worker-startup-timeout-secs") == 1
    assert argv[argv.index("--worker-startup-timeout-secs") + 1] == "5"


def test_no_router_table_no_router():
    assert spec_of(LAYOUT.split("[router]")[0]) is None


def test_the_spec_survives_the_state_file_and_knows_what_needs_a_restart():
    from dataclasses import replace

    from vsup.router import RouterSpec

    spec = spec_of(LAYOUT)
    assert RouterSpec.from_json(spec.to_json()) == spec
    # members change through the worker API: no restart; anything else is a new process
    assert spec.same_process(replace(spec, workers={"a0": spec.workers["a0"]}))
    assert not spec.same_process(replace(spec, policy="round_robin"))
    assert not spec.same_process(replace(spec, args={}))


def test_a_state_file_router_that_cannot_be_rebuilt_says_why():
    import pytest

    from vsup.router import RouterSpec

    with pytest.raises(ValueError, match="cannot rebuild the router spec"):
        RouterSpec.from_json({"port": 1})
