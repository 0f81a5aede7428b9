"""Layouts that would do harm: secrets written down, no instances, files that are no layout;
and `vsup validate` over several files."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout import rules
from vsup.layout.files import MAX_FILE_BYTES
from vsup.layout.model import load_layout, loads_layout
from vsup.layout.secrets import is_secret_name, secret_value_kind
from vsup.layout.validate import validate

from tests.conftest import outside_cwd

REPO = Path(__file__).resolve().parents[3]
HF = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h"  # the shape of a Hugging Face token
SK = "sk-proj-" + "Xy7_Qw3-Er9Ty2Ui5Op8As1Df4Gh6Jk0Lz"

LAYOUT = """\
[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
{defaults}

[[instance]]
name = "a"
gpus = []
port = 8101
{instance}
"""


def check(text: str, tmp_path: Path):
    return validate(loads_layout(text, tmp_path / "l.toml"), node_gpus=0, profile_dirs=[])


def layout(defaults: str = "", instance: str = "") -> str:
    return LAYOUT.format(defaults=defaults, instance=instance)


# -- secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "VLLM_API_KEY", "api-key", "hf-token", "AWS_SECRET_ACCESS_KEY", "DB_PASSWD"],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "max-num-batched-tokens",
        "ssl-keyfile",
        "PASSWORD_FILE",
        "tokenizer",
        "VLLM_USE_FASTOKENS",
        "CUDA_VISIBLE_DEVICES",
    ],
)
def test_names_that_only_look_secret_are_not(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "value",
    [
        HF,
        SK,
        "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        "AKIAIOSFODNN7EXAMPLE",
        "Bearer abcdefghijklmnop123456",
        "Zq8Xv2Lk9Pw3Mn7Rt5Yb1Hc6Jd4Fg0Sa",
        "Authorization: Bearer " + HF,
    ],
)
def test_token_shaped_values(value):
    assert secret_value_kind(value)


@pytest.mark.parametrize(
    "value",
    [
        "meta-llama/Llama-3.1-8B-Instruct",
        "neuralmagic/Meta-Llama-3.1-405B-Instruct-FP8",
        "/models/DeepSeek-R1-Distill-Qwen-32B",
        "./models/Qwen2.5-7B-Instruct-GPTQ-Int4",
        "~/hf/hub/models--org--name/snapshots/5f0b02c75b57c5855da9ae460ce51323ea669d8a",
        "5f0b02c75b57c5855da9ae460ce51323ea669d8a",  # a --revision commit
        "123e4567-e89b-12d3-a456-426614174000",
        "DeepSeekCoderV2LiteInstruct16BChat",
        "NousResearchHermes3Llama31405BFP8",
        "Llama3_1_8B_Instruct_GPTQ_INT4_Marlin",
        "FULL_AND_PIECEWISE",
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "hf_transfer",
        "sk-learn",
        "float32",
    ],
)
def test_model_names_paths_and_hashes_are_not_tokens(value):
    assert secret_value_kind(value) is None


@pytest.mark.parametrize(
    "defaults,instance,key",
    [
        ("", f'args = {{ hf-token = "{HF}" }}', "args.hf-token"),
        ("", 'args = { api-key = "short" }', "args.api-key"),
        (f'env = {{ HF_TOKEN = "{HF}" }}', "", "env.HF_TOKEN"),
        ('env = { MY_SERVICE_PASSWORD = "hunter2" }', "", "env.MY_SERVICE_PASSWORD"),
        ("", f'args = {{ served-model-name = "{SK}" }}', "args.served-model-name"),
        (f'env = {{ SOMETHING = "{HF}" }}', "", "env.SOMETHING"),
        (
            "",
            f'args = {{ override-generation-config = {{ x = "{SK}" }} }}',
            "args.override-generation-config",
        ),
    ],
)
def test_secrets_in_a_layout_are_errors_pointing_at_their_line(tmp_path, defaults, instance, key):
    text = layout(defaults, instance)
    errors = [d for d in check(text, tmp_path) if d.is_error]
    assert [d.key for d in errors] == [key], [d.format() for d in errors]
    (e,) = errors
    assert "a secret must not be written in the layout" in e.message
    assert "api_key_env" in e.message or "environment" in e.message
    written = text.splitlines()[e.line - 1]
    assert key.split(".")[-1] in written


def test_secret_in_the_command_line_is_an_error(tmp_path):
    text = layout().replace(
        '"vllm.entrypoints.openai.api_server"]',
        '"vllm.entrypoints.openai.api_server", "--api-key", "abc"]',
    )
    (e,) = [d for d in check(text, tmp_path) if d.is_error]
    assert e.key == "command" and "--api-key takes a secret" in e.message


def test_bare_hf_token_flag_and_empty_secret_names_are_fine(tmp_path):
    text = layout('env = { HF_TOKEN = "" }', "args = { hf-token = true, allow-credentials = true }")
    assert not [d for d in check(text, tmp_path) if d.is_error]


def test_secret_in_a_profile_points_at_the_profile(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "leaky.toml").write_text(f'[defaults]\nenv = {{ HF_TOKEN = "{HF}" }}\n')
    text = '[layout]\nprofiles = ["leaky"]\n' + layout()
    diags = validate(loads_layout(text, tmp_path / "l.toml"), node_gpus=0, profile_dirs=[configs])
    (e,) = [d for d in diags if d.is_error]
    assert e.file == str(configs / "leaky.toml") and e.line == 2 and e.key == "env.HF_TOKEN"


# -- no instances ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "# nothing yet\n", '[layout]\nname = "x"\n', "[defaults]\n"])
def test_a_layout_without_instances_is_an_error(tmp_path, text):
    (e,) = [d for d in check(text, tmp_path) if d.is_error]
    assert "no [[instance]]" in e.message and "empty = true" in e.message


def test_empty_true_means_it(tmp_path):
    assert check("[layout]\nempty = true\n", tmp_path) == []
    warnings = check("[layout]\nempty = true\n" + layout(), tmp_path)
    assert [(d.severity, d.key) for d in warnings] == [("warning", "empty")]
    errors = check('[layout]\nempty = "yes"\n', tmp_path)
    assert any(e.key == "empty" and "must be a boolean" in e.message for e in errors), errors


# -- files that are not layouts --------------------------------------------------------------


def test_dev_zero_a_fifo_a_directory_and_a_huge_file_are_refused_quickly(tmp_path):
    """Refused from what the file is, not by reading it: a read of /dev/zero never ends and
    an open of a FIFO with no writer never returns, so each load runs in a thread that must
    finish (a generous 60 s) while no writer ever opens the FIFO; the huge file is refused by
    its size."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    cases = {
        "/dev/zero": "a device",
        str(fifo): "a FIFO",
        str(tmp_path): "a directory",
        str(huge): "larger than 1024 KiB",
    }
    for path, words in cases.items():
        loaded: list = []
        loader = threading.Thread(
            target=lambda p=path, out=loaded: out.append(load_layout(p)), daemon=True
        )
        loader.start()
        loader.join(60)
        if loader.is_alive() and path == str(fifo):  # let it go before failing
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        assert not loader.is_alive() and loaded, f"load_layout({path!r}) did not return"
        (e,) = loaded[0].load_errors
        assert words in e.message and e.file == path, e.format()
    ok = tmp_path / "ok.toml"
    ok.write_bytes(b"#" * (MAX_FILE_BYTES - 1) + b"\n")
    assert not load_layout(ok).load_errors


def test_vsup_up_and_validate_refuse_dev_zero_and_binary_in_one_line(tmp_path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'[layout]\nname = "\xff\xfe"\n')
    env = dict(os.environ, VSUP_HOME=str(tmp_path / "home"))
    for argv in (["up", "/dev/zero", "--detach"], ["up", str(binary), "--detach"],
                 ["validate", "/dev/zero"], ["validate", str(binary)]):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "vsup", *argv],
            cwd=outside_cwd(),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, (argv, result.stderr)
        assert "Traceback" not in result.stderr and len(lines) <= 2, result.stderr
        assert argv[1] in lines[0] and ("device" in lines[0] or "UTF-8" in lines[0]), lines
    assert not (tmp_path / "home" / "vsup.sock").exists()  # refused before any daemon started


def test_a_fifo_never_blocks_the_reader(tmp_path):
    fifo = tmp_path / "layout.toml"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        load_layout(fifo)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5)


# -- several files at once ------------------------------------------------------------------


def test_validate_several_files_attributes_every_line(tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "p.toml").write_text('[defaults]\nenv = { HIP_VISIBLE_DEVICES = "0" }\n')
    good = tmp_path / "good.toml"
    good.write_text('[layout]\nprofiles = ["p"]\n' + layout())
    bad = tmp_path / "bad.toml"
    bad.write_text(layout(instance="port = 80000").replace("port = 8101\n", "", 1))
    assert main(["validate", str(good), str(bad), "--node-gpus", "0"]) == 2
    out, err = capsys.readouterr()
    assert f"{good}: valid (1 instance, 1 warning)" in out
    assert f"{good}: {configs / 'p.toml'}:2: warning: " in err  # the profile's line, attributed
    assert f"{bad}:9: error: instance 'a': key 'port': port 80000 is out of range" in err
    assert f"{bad}: 1 error" in err
    assert main(["validate", str(good), str(good), "--node-gpus", "0"]) == 0
    capsys.readouterr()
    assert main(["validate", str(good), str(bad), "--node-gpus", "0", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert [(d["path"], d["valid"]) for d in doc["layouts"]] == [
        (str(good), True),
        (str(bad), False),
    ]


def test_demo_layout_says_make_demo_generates_its_model(tmp_path):
    copy = tmp_path / "layouts" / "cpu-demo.toml"
    copy.parent.mkdir()
    shutil.copy(REPO / "layouts" / "cpu-demo.toml", copy)
    errors = [d for d in validate(load_layout(copy), node_gpus=0) if d.is_error]
    assert errors and all("`make demo` generates" in d.message for d in errors), errors


# -- one parser, one rule each --------------------------------------------------------------


def test_daemon_exporter_and_layout_share_one_listen_parser():
    from vsup.control import export
    from vsup.layout import listen

    assert export.parse_listen is listen.parse_listen
    assert loads_layout('[layout]\nmetrics_listen = "[::1]:9400"\n').metrics_listen == ("::1", 9400)
    assert loads_layout('[layout]\nmetrics_listen = "::1:9400"\n').metrics_listen is None


def test_daemon_and_dashboard_mask_with_the_one_secret_rule():
    from vsup.control import service
    from vsup.layout import secrets
    from vsup.tui.widgets import detail

    assert service.SECRET_NAME is secrets.SECRET_NAME and detail._SECRET is secrets.SECRET_NAME


def test_every_rule_function_is_registered():
    registered = set(rules.LAYOUT_RULES) | set(rules.INSTANCE_RULES)
    for module in (rules.attention, rules.env, rules.flags, rules.gpus, rules.instances,
                   rules.kv, rules.model, rules.parallelism, rules.ports, rules.secrets,
                   rules.cpu):  # fmt: skip
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_"):
                assert fn in registered, f"{module.__name__}.{name} is not in a rule list"
