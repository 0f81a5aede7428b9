"""VLLM_SERVER_DEV_MODE turned on through `env` on a host other than loopback (issue 35 item
18): it opens /sleep, /wake_up, /collective_rpc and /reset_prefix_cache to whoever reaches the
port, as a sleep table would, and validated without a word. Now a warning names it."""

from __future__ import annotations

import pytest

from vsup.layout.model import loads_layout
from vsup.layout.node import NodeFacts
from vsup.layout.validate import validate

LAYOUT = """\
[layout]
name = "dev"

[defaults]
model = "org/model"
host = "{host}"
env = {{ VLLM_SERVER_DEV_MODE = "{value}" }}
{sleep}

[[instance]]
name = "a"
gpus = []
port = 8000
"""


def diags(host: str, value: str, sleep: str = "") -> list:
    layout = loads_layout(LAYOUT.format(host=host, value=value, sleep=sleep), "dev.toml")
    return [d for d in validate(layout, node=NodeFacts()) if "VLLM_SERVER_DEV_MODE" in d.message]


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "node7.example"])
def test_dev_mode_through_env_on_a_public_host_is_a_warning(host):
    (d,) = diags(host, "1")
    assert d.severity == "warning" and d.instance == "a"
    assert d.key == "env.VLLM_SERVER_DEV_MODE" and f"host = '{host}'" in d.message
    assert "/collective_rpc" in d.message and "127.0.0.1" in d.message


@pytest.mark.parametrize(
    ("host", "value"), [("127.0.0.1", "1"), ("localhost", "1"), ("0.0.0.0", "0")]
)
def test_loopback_or_off_says_nothing(host, value):
    assert diags(host, value) == []


def test_a_sleep_table_keeps_its_own_error_and_gets_no_second_word():
    found = diags("0.0.0.0", "1", sleep="sleep = { level = 1 }")
    assert [d.severity for d in found] == ["error"]
    assert "a sleep table turns on vLLM's dev mode" in found[0].message
