"""Credentials inside values (a URL's password, `password=...`, `token=...`) are errors naming
the file, instance and key; a Prometheus exporter open to the network is a warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vsup.layout.model import loads_layout
from vsup.layout.validate import validate

from tests.conftest import outside_cwd

LAYOUT = """\
[layout]
name = "l"
{header}

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"{command}]

[[instance]]
name = "a"
gpus = []
port = 8101
{instance}
"""


def text(header: str = "", instance: str = "", command: str = "") -> str:
    return LAYOUT.format(header=header, instance=instance, command=command)


def check(layout_text: str, tmp_path: Path):
    return validate(loads_layout(layout_text, tmp_path / "l.toml"), node_gpus=0, profile_dirs=[])


def vsup_validate(tmp_path: Path, layout_text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "l.toml"
    path.write_text(layout_text)
    return subprocess.run(
        [sys.executable, "-m", "vsup", "validate", str(path), "--node-gpus", "0"],
        capture_output=True,
        text=True,
        cwd=outside_cwd(),
        timeout=120,
    )


@pytest.mark.parametrize(
    "instance,key,what",
    [
        ('env = { HF_ENDPOINT = "https://me:hunter2@mirror.example/hf" }', "env.HF_ENDPOINT",
         "a URL with a password"),
        ('env = { DSN = "host=db user=vsup password=hunter2" }', "env.DSN", "password=..."),
        ('args = { kv-transfer-config = "redis://:s3cret@cache:6379" }',
         "args.kv-transfer-config", "a URL with a password"),
        ('env = { FEED = "https://feeds.example/x?token=abc123" }', "env.FEED", "token=..."),
    ],
)  # fmt: skip
def test_a_credential_inside_a_value_is_an_error_naming_file_instance_and_key(
    tmp_path, instance, key, what
):
    layout_text = text(instance=instance)
    errors = [d for d in check(layout_text, tmp_path) if d.is_error]
    assert [d.key for d in errors] == [key], [d.format() for d in errors]
    (e,) = errors
    assert e.instance == "a" and e.file == str(tmp_path / "l.toml")
    assert what in e.message and "variable" in e.message
    assert key.split(".")[-1] in layout_text.splitlines()[e.line - 1]
    res = vsup_validate(tmp_path, layout_text)
    assert res.returncode == 2, res.stderr
    assert str(tmp_path / "l.toml") in res.stderr and "a" in res.stderr and key in res.stderr


def test_a_credential_in_the_command_is_an_error(tmp_path):
    layout_text = text(command=', "--hf-endpoint=https://me:pw@mirror.example"')
    (e,) = [d for d in check(layout_text, tmp_path) if d.is_error]
    assert e.key == "command" and "a URL with a password" in e.message


@pytest.mark.parametrize(
    "value",
    [
        "https://mirror.example/hf",
        "https://me@mirror.example",
        "postgres://vsup:${DB_PASSWORD}@db/x",
        "http://[::1]:8000/v1",
        "max-num-batched-tokens=8192",
        "token=$HF_TOKEN",
        "{% set bos_token = 'x' %}{{ bos_token }}",
        "tokenizer=org/model",
    ],
)
def test_values_without_credentials_pass(value):
    from vsup.layout.secrets import credential_kind

    assert credential_kind(value) is None


@pytest.mark.parametrize(
    "listen,warned",
    [
        ('"0.0.0.0:9400"', "every interface"),
        ('"[::]:9400"', "every interface"),
        ('"10.1.2.3:9400"', "other hosts may reach"),
        ('"exporter.example:9400"', "other hosts may reach"),
        ('"127.0.0.1:9400"', None),
        ('"[::1]:9400"', None),
        ('"localhost:9400"', None),
    ],
)
def test_an_exporter_open_to_the_network_is_a_warning(tmp_path, listen, warned):
    layout_text = text(header=f"metrics_listen = {listen}")
    diags = check(layout_text, tmp_path)
    assert not [d for d in diags if d.is_error], [d.format() for d in diags]
    found = [d for d in diags if d.key == "metrics_listen"]
    if warned is None:
        assert not found, [d.format() for d in found]
        return
    (w,) = found
    assert w.severity == "warning" and warned in w.message and "no authentication" in w.message
    assert "127.0.0.1:9400" in w.message
    assert "metrics_listen" in layout_text.splitlines()[w.line - 1]
    res = vsup_validate(tmp_path, layout_text)
    assert res.returncode == 0 and "no authentication" in res.stderr, res.stderr
