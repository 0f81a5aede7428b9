"""The `[router]` table: its keys, its ports, its model, and load -> save -> load."""

from __future__ import annotations

import dataclasses

import pytest

from vsup.layout.model import dumps_layout, loads_layout
from vsup.layout.validate import validate

BASE = """\
[layout]
name = "t"

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]

[[instance]]
name = "g0"
gpus = [0]
port = 8000

[[instance]]
name = "g1"
gpus = [1]
port = 8001
"""


def diagnostics(text: str):
    return validate(loads_layout(text, "/tmp/l.toml"), node_gpus=2)


def errors(text: str):
    return [d for d in diagnostics(text) if d.is_error]


def test_a_router_with_its_own_ports_validates():
    text = (
        BASE + '\n[router]\nport = 8080\npolicy = "round_robin"\nargs = { retry-max-retries = 3 }\n'
    )
    assert errors(text) == []
    # vsup runs the router now: no warning that it does not
    assert [d for d in diagnostics(text) if d.table == "[router]"] == []


@pytest.mark.parametrize(
    ("router", "key", "words"),
    [
        ("port = 8001", "port", "instance 'g1'"),
        ("port = 7999", "metrics_port", "port + 1 = 8000"),
        ("port = 8080\nmetrics_port = 8080", "port", "the router's port"),
        ('port = 8080\npolicy = "round-robin"', "policy", "did you mean 'round_robin'"),
        ("port = 8080\nargs = { worker-urls = ['http://x:1'] }", "args.worker-urls", "vsup sets"),
        ("port = 8080\nargs = { prometheus_port = 9 }", "args.prometheus_port", "metrics_port"),
        ('host = "0.0.0.0"', "port", "missing: add port"),
        ('port = 8080\nargs = { api-key = "x" }', "args.api-key", "shows in ps"),
        ("port = 8080\nweight = 2", "weight", "unknown key"),
        ('port = 8080\nmodel = "org/other"', "model", "no instance serves model 'org/other'"),
        ("port = 8080\nhold_s = 0", "hold_s", "must be greater than 0"),
        ('port = 8080\nhold_s = "long"', "hold_s", "number"),
        ("port = 8080\nhold_queue = 0", "hold_queue", "must be 1 or more"),
        ("port = 8080\nhold_queue = 2.5", "hold_queue", "int"),
        ("port = 8080\nargs = { enable-igw = true }", "args.enable-igw", "vsup sets"),
    ],
)
def test_router_mistakes_are_errors_naming_the_key(router, key, words):
    found = errors(BASE + "\n[router]\n" + router + "\n")
    assert any(d.key == key and words in d.message for d in found), [d.format() for d in found]
    assert all(d.file == "/tmp/l.toml" for d in found)


def test_router_metrics_port_clashing_with_the_exporter_is_an_error():
    text = BASE.replace('name = "t"', 'name = "t"\nmetrics_listen = "127.0.0.1:9400"')
    found = errors(text + "\n[router]\nport = 8080\nmetrics_port = 9400\n")
    assert [d.key for d in found] == ["metrics_port"]
    assert "metrics exporter" in found[0].message


def test_a_router_over_two_models_serves_both_or_the_one_it_names():
    """Instances of several models behind one router: vllm-router's gateway mode sends each
    request to its model's instances (docs/router.md, "Several models")."""
    from vsup.router import router_spec

    text = BASE.replace("port = 8001\n", 'port = 8001\nmodel = "org/other"\n')
    assert errors(text + "\n[router]\nport = 8080\n") == []
    layout = loads_layout(text + "\n[router]\nport = 8080\n")
    spec = router_spec(layout, layout.resolve())
    assert spec.models == {"g0": "org/model", "g1": "org/other"} and spec.igw
    assert "--enable-igw" in spec.argv()
    assert errors(text + '\n[router]\nport = 8080\nmodel = "org/other"\n') == []
    layout = loads_layout(text + '\n[router]\nport = 8080\nmodel = "org/other"\n')
    one = router_spec(layout, layout.resolve())
    assert not one.igw and "--enable-igw" not in one.argv() and list(one.workers) == ["g1"]
    # the mode is the router's process: switching it restarts the router
    base = loads_layout(BASE + "\n[router]\nport = 8080\n")
    single = router_spec(base, base.resolve())
    assert single is not None and spec is not None
    assert not single.igw and not spec.same_process(single)
    assert single.same_process(dataclasses.replace(single, hold_s=5.0, hold_queue=3))


def test_router_must_be_a_table():
    found = errors("router = 8080\n" + BASE)
    assert any(d.key == "router" and "[router] table" in d.message for d in found)


def test_the_router_table_survives_save_and_load():
    text = (
        BASE
        + '\n[router]\nport = 8080\npolicy = "power_of_two"\nargs = { retry-max-retries = 3 }\n'
    )
    layout = loads_layout(text)
    again = loads_layout(dumps_layout(layout))
    assert (
        again.router
        == layout.router
        == {
            "port": 8080,
            "policy": "power_of_two",
            "args": {"retry-max-retries": 3},
        }
    )
    assert loads_layout(BASE).router is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "node7.example"])
def test_a_router_other_hosts_reach_is_a_warning_that_names_the_open_worker_api(host):
    text = BASE + f'\n[router]\nport = 8080\nhost = "{host}"\n'
    (warning,) = [d for d in diagnostics(text) if d.key == "host"]
    assert warning.severity == "warning" and warning.table == "[router]"
    assert f"listens on {host}:8080" in warning.message
    assert "POST /add_worker" in warning.message and "no authentication" in warning.message
    assert warning.line is not None


@pytest.mark.parametrize("host", [None, "127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_router_on_loopback_gets_no_such_warning(host):
    line = f'host = "{host}"\n' if host else ""
    text = BASE + f"\n[router]\nport = 8080\n{line}"
    assert [d for d in diagnostics(text) if d.key == "host"] == []
