"""The fleet tests talk to real OpenSSH servers (tests/integration/fleet/sshnodes.py): they
skip, saying so, only where no sshd can be had (`make test` installs Debian's openssh-server)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.fleet.sshnodes import sshd_missing
from tests.unit.control.helpers import EMULATOR


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = sshd_missing()
    if why is None:
        return
    for item in items:
        if "integration/fleet" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=why))


def node_layout(name: str, ports: dict[str, int], extra_header: str = "", args: str = "") -> str:
    """A layout of vLLM emulators (tests/programs/vllm_emulator.py) named `name`."""
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "{name}"
{extra_header}

[defaults]
model = "test/fake"
# not a hub model; without this a daemon that `vsup fleet up` starts over SSH (SSH's own
# environment: no HF_HUB_OFFLINE from the test's) would try to pull it
pull = false
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.2
stop_grace_s = 5
drain_timeout_s = 1
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, stable_s = 60, max_failures = 2 }}
{args}
"""
    for inst, port in ports.items():
        text += f'\n[[instance]]\nname = "{inst}"\ngpus = []\nport = {port}\n'
    return text
