"""`vsup paths --json`, what the fleet runs on a node: read-only (it creates no VSUP_HOME and
starts no daemon) and it names the socket, the daemon (none here) and the versions."""

from __future__ import annotations

import json

from tests.conftest import run_vsup


def test_paths_names_home_socket_and_versions_and_creates_nothing(tmp_path):
    home = tmp_path / "not-yet"
    res = run_vsup(home, "paths", "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["home"] == str(home) and doc["socket"] == str(home / "vsup.sock")
    assert doc["daemon"] is None and doc["version"]
    from importlib import metadata

    assert doc["vllm_version"] == metadata.version(metadata.packages_distributions()["vllm"][0])
    assert not home.exists()  # read-only: nothing made, no daemon started
    text = run_vsup(home, "paths", timeout=60)
    assert text.returncode == 0 and f"socket: {home / 'vsup.sock'}" in text.stdout
