"""`[layout] canary_s`, `canary` and the `canary_*` thresholds (docs/canary.md): types and ranges
with the file and key named, the rules that read them together, and the compiled settings."""

from __future__ import annotations

from pathlib import Path

from vsup.layout.compiled import layout_settings
from vsup.layout.model import Layout, load_layout
from vsup.layout.spec import CanarySettings
from vsup.layout.validate import validate

LAYOUT = """\
[layout]
{header}

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


def check(tmp_path: Path, header: str) -> tuple[Layout, list[str]]:
    path = tmp_path / "l.toml"
    path.write_text(LAYOUT.format(header=header))
    layout = load_layout(path)
    # the messages without the file's path (pytest names the directory after the test)
    return layout, [d.format().replace(str(path), "l.toml") for d in validate(layout, node_gpus=2)]


def test_no_canary_keys_is_todays_rolling_apply(tmp_path):
    layout, diagnostics = check(tmp_path, 'name = "x"')
    assert [d for d in diagnostics if "canary" in d] == []
    canary = layout_settings(layout).rollout.canary
    assert canary == CanarySettings() and not canary.enabled


def test_the_keys_compile_into_the_rollouts_canary(tmp_path):
    layout, diagnostics = check(
        tmp_path,
        'canary_s = 45\ncanary = 2\ncanary_min_requests = 50\ncanary_insufficient = "fail"\n'
        "canary_p99_ratio = 1.5\ncanary_p50_ratio = 1.25\ncanary_failed_pct = 0.5\n"
        "canary_min_failed = 3\ncanary_min_delta_ms = 5\ncanary_preemption_ratio = 3\n"
        "canary_min_preemptions_per_min = 1\ncanary_max_s = 100",
    )
    assert [d for d in diagnostics if "canary" in d] == []
    c = layout_settings(layout).rollout.canary
    assert c == CanarySettings(
        watch_s=45,
        instances=2,
        min_requests=50,
        insufficient="fail",
        max_s=100,
        failed_pct=0.5,
        min_failed=3,
        p50_ratio=1.25,
        p99_ratio=1.5,
        min_delta_ms=5,
        preemption_ratio=3,
        min_preemptions_per_min=1,
    )
    assert c.enabled and c.limit_s == 45  # 'fail' never extends
    assert CanarySettings(watch_s=30).limit_s == 120  # extend: 4 x canary_s by default


def test_bad_values_name_the_file_and_key(tmp_path):
    _, diagnostics = check(
        tmp_path,
        'canary_s = -1\ncanary = 0\ncanary_insufficient = "retry"\ncanary_p99_ratio = 0.5\n'
        'canary_min_requests = "many"',
    )
    text = "\n".join(diagnostics)
    for key, words in (
        ("canary_s", "must be 0 or more (it is -1)"),
        ("canary", "must be 1 or more (it is 0)"),
        ("canary_insufficient", "must be 'pass', 'fail' or 'extend'"),
        ("canary_p99_ratio", "must be 1 or more: a ratio to the old instances (it is 0.5)"),
        ("canary_min_requests", "integer"),
    ):
        hit = [d for d in diagnostics if f"key '{key}'" in d]
        assert any(words in d and d.startswith("l.toml:") for d in hit), (key, text)


def test_thresholds_without_canary_s_warn_and_max_below_watch_is_an_error(tmp_path):
    _, diagnostics = check(tmp_path, "canary = 2\ncanary_p99_ratio = 3")
    warned = [d for d in diagnostics if "has no effect without a canary" in d]
    assert len(warned) == 2 and all("warning" in d for d in warned)
    _, diagnostics = check(tmp_path, "canary_s = 60\ncanary_max_s = 30")
    (err,) = [d for d in diagnostics if "canary_max_s" in d]
    assert "error" in err and "shorter than canary_s (60 s)" in err
