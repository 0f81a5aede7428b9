"""The dashboard's pure parts: formatting, row diffs, column fitting, HBM bars, sparklines
and layout edits."""

from __future__ import annotations

import tomllib

import pytest

from vsup.answers import ApplyPlan, InstanceConfig
from vsup.answers import History as HistoryAnswer
from vsup.snapshot import Advice, GpuProcess, GpuStatus, empty_instance
from vsup.tui import fmt, gpubar, layout_edit, rows
from vsup.tui.history import History, spark
from vsup.tui.validation import plan_text
from vsup.tui.widgets.detail import advice_text, config_text, exit_text, masked_env

from tests.support import samples


def test_unknown_values_render_as_a_dash_never_zero():
    assert fmt.size(None) == fmt.count(None) == fmt.percent(None) == fmt.duration(None) == "-"
    inst = empty_instance("a")
    cells = dict(
        zip([c.key for c in rows.COLUMNS], rows.row_cells(inst, rows.COLUMNS), strict=False)
    )
    assert cells["kv"][0] == "-" and cells["tok_s"][0] == "-" and cells["hbm"][0] == "-"
    assert cells["run_wait"][0] == "-/-"


@pytest.mark.parametrize(
    "value,text",
    [
        (0, "0"),
        (7.0, "7"),
        (12.5, "12.5"),
        (412.3, "412"),
        (1874.2, "1.9k"),
        (43_1232, "431k"),
        (3_400_000, "3.4M"),
    ],
)
def test_counts_are_compact(value, text):
    assert fmt.count(value) == text


@pytest.mark.parametrize(
    "seconds,text", [(45, "45s"), (723, "12m03s"), (11_520, "3h12m"), (5 * 86400 + 7200, "5d02h")]
)
def test_durations_keep_two_units(seconds, text):
    assert fmt.duration(seconds) == text


def test_every_state_has_a_distinct_symbol_so_colour_is_not_needed():
    symbols = [fmt.state_label(s).split()[0] for s in fmt.STATE_LOOK]
    assert len(set(symbols)) == len(symbols)
    assert fmt.state_label("backoff", 12) == "↻ backoff 12s"


def test_backend_says_whether_it_was_read_or_inferred():
    assert fmt.backend("FLASH_ATTN", "log") == "FLASH_ATTN"
    assert fmt.backend("CPU_ATTN", "default") == "CPU_ATTN ~dflt"
    assert fmt.backend("TRITON_ATTN", "flag") == "TRITON_ATTN ~flag"


def test_diff_reports_only_changed_cells_and_order_only_when_it_changes():
    a = {"x": (("x", ""), ("1", "")), "y": (("y", ""), ("2", ""))}
    b = {"x": (("x", ""), ("1", "")), "y": (("y", ""), ("3", "red"))}
    diff = rows.diff_rows(a, ["x", "y"], b, ["x", "y"])
    assert diff.changed == [("y", 1, ("3", "red"))] and diff.order is None
    assert rows.diff_rows(a, ["x", "y"], a, ["x", "y"]).empty
    moved = rows.diff_rows(a, ["x", "y"], a, ["y", "x"])
    assert moved.order == ["y", "x"] and not moved.changed
    c = {"y": a["y"], "z": (("z", ""), ("9", ""))}
    grown = rows.diff_rows(a, ["x", "y"], c, ["y", "z"])
    assert grown.removed == ["x"] and grown.added == [("z", c["z"])] and grown.order is None


def test_columns_fit_the_width_most_important_first():
    for width in (60, 76, 100, 156, 220):
        cols = rows.columns_for(width, has_gpus=True)
        assert sum(c.width + rows.PADDING for c in cols) <= max(width, 0) or len(cols) == 1
        assert [c.key for c in cols][:2] == ["name", "gpus"] or cols[1].key == "state"
    assert "model" in [c.key for c in rows.columns_for(156, True)]
    assert "hbm" not in [c.key for c in rows.columns_for(156, False)]
    model = [c for c in rows.columns_for(220, True) if c.key == "model"][0]
    assert model.width > rows.MODEL_MIN  # the model column takes what is left


def test_sorts_put_problems_and_pressure_first():
    snap = samples.gpu_node()
    assert rows.sorted_names(snap.instances, "state")[:2] == ["gpu7", "gpu3"]
    assert rows.sorted_names(snap.instances, "preempt_rate")[0] == "gpu6b"
    assert rows.sorted_names(snap.instances, "kv", reverse=True)[-1] == "gpu6b"


def test_filter_matches_name_model_state_backend_and_port():
    inst = empty_instance(
        "gpu6b", model="Qwen/Qwen2.5-7B", state="ready", port=8007, backend="TRITON_ATTN"
    )
    for needle in ("6b", "qwen", "READY", "triton", "8007", ""):
        assert rows.matches(inst, needle)
    assert not rows.matches(inst, "llama")


def test_hbm_bar_splits_instances_foreign_and_unattributed_memory():
    gib = 2**30
    gpu = GpuStatus(
        0,
        "NVIDIA H200",
        100 * gib,
        72 * gib,
        90.0,
        60.0,
        500.0,
        processes=(
            GpuProcess(1, 40 * gib, "a"),
            GpuProcess(2, 20 * gib, "b"),
            GpuProcess(3, 10 * gib, None),
        ),
    )
    a = empty_instance("a", gpus=(0,), gpu_memory_utilization=0.45)
    b = empty_instance("b", gpus=(0,), gpu_memory_utilization=0.45)
    use = gpubar.gpu_use(gpu, [a, b])
    assert [s.actual for s in use.shares] == [40 * gib, 20 * gib]
    assert use.foreign == 10 * gib and use.other == 2 * gib
    assert gpubar.bar(use, 50).plain == (
        "▕" + "█" * 20 + "▓" * 10 + "░" * 5 + "▒" + "·" * 8 + "┊" + "·" * 5 + "▏"
    )
    assert "foreign 10.0G" in gpubar.legend(use).plain


def test_instance_is_flagged_over_plan_only_when_the_advice_says_so():
    gib = 2**30
    gpu = GpuStatus(
        0, "H200", 100 * gib, 60 * gib, None, None, None, processes=(GpuProcess(1, 50 * gib, "a"),)
    )
    a = empty_instance("a", gpus=(0,), gpu_memory_utilization=0.45)
    advice = [Advice("hbm_over_plan", "warning", "a: holds ...", instance="a", gpu=0)]
    over = rows.over_plan_names(advice)
    use = gpubar.gpu_use(gpu, [a], over)
    assert use.shares[0].over_plan
    assert "▲over plan" in gpubar.legend(use).plain
    inst = empty_instance("a", hbm_bytes=50 * gib, planned_hbm_bytes=45 * gib, hbm_source="process")
    assert rows.hbm_cell(inst, "a" in over) == ("▲50.0/45.0G", "bold red")
    # issue 20: above the share by vLLM's own overhead, no advice: no alarm
    assert not gpubar.gpu_use(gpu, [a]).shares[0].over_plan
    assert "over plan" not in gpubar.legend(gpubar.gpu_use(gpu, [a])).plain
    assert rows.hbm_cell(inst) == ("50.0/45.0G", "")


def test_sparkline_scales_to_a_fixed_top_and_shows_gaps():
    assert spark([0.0, 0.5, 1.0], 3, top=1.0) == "▁▅█"
    assert spark([None, 2.0, 4.0], 5) == "   ▅█"
    assert spark([1, 2, 3, 4], 2) == "▆█"


def test_history_is_seeded_before_what_the_dashboard_saw_and_forgets_removed_instances():
    hist = History(keep=5)
    hist.append(samples.cpu_node(0))
    hist.seed("cpu0", HistoryAnswer(kv_cache_usage=(0.1, 0.2)))
    assert list(hist.values("cpu0", "kv_cache_usage")) == [0.1, 0.2, 0.42]
    snap = samples.cpu_node(1)
    import dataclasses

    hist.append(dataclasses.replace(snap, instances=snap.instances[1:]))
    assert hist.values("cpu0", "kv_cache_usage") == () and "cpu0" not in hist.seeded


def test_secrets_are_masked_even_when_the_daemon_did_not():
    env = masked_env({"HF_TOKEN": "hf_x", "VLLM_API_KEY": "****", "CUDA_VISIBLE_DEVICES": "0"})
    assert env == {"HF_TOKEN": "****", "VLLM_API_KEY": "****", "CUDA_VISIBLE_DEVICES": "0"}
    config = InstanceConfig(argv=("vllm",), env={"HF_TOKEN": "hf_x"})
    assert "hf_x" not in config_text(config).plain


def test_form_values_round_trip_through_the_instance_table():
    table = {
        "name": "g0",
        "gpus": [0, 1],
        "port": 8000,
        "gpu_memory_utilization": 0.45,
        "model": "org/m",
        "args": {"max-model-len": 4096, "enforce-eager": True, "compilation-config": {"mode": 3}},
        "env": {"VLLM_ROCM_USE_AITER": "1"},
    }
    assert layout_edit.parse_form(layout_edit.form_values(table)) == table


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("name", "bad name", "name: 'bad name' is not a name"),
        ("gpus", "0,x", "gpus: '0,x' is not a list of GPU indices"),
        ("port", "70000", "port: 70000 is outside 1-65535"),
        ("gpu_memory_utilization", "1.5", "gpu_memory_utilization: 1.5 is not in (0, 1]"),
        ("env", "A 1", "env: not a TOML inline table body"),
        ("env", "A = [1]", 'env: A must be a string, e.g. A = "1"'),
    ],
)
def test_form_fields_of_the_wrong_type_name_the_field(field, value, message):
    values = {"name": "g0", "port": "8000", field: value}
    with pytest.raises(layout_edit.FieldError) as err:
        layout_edit.parse_form(values)
    assert str(err.value).startswith(message) and err.value.field == field


def test_edit_keeps_keys_the_form_does_not_show_and_blank_fields_inherit():
    existing = {
        "name": "g0",
        "port": 8000,
        "gpus": [0],
        "model": "org/m",
        "restart": {"policy": "always"},
    }
    form = layout_edit.parse_form({"name": "g0", "port": "8001", "gpus": "0"})
    merged = layout_edit.merged_table(existing, form)
    assert merged == {"name": "g0", "gpus": [0], "port": 8001, "restart": {"policy": "always"}}


def test_layout_edits_add_replace_and_remove_instances():
    text = samples.layout_for(samples.cpu_node())
    added = layout_edit.with_instance(text, {"name": "cpu2", "gpus": [], "port": 8103})
    assert [t["name"] for t in tomllib.loads(added)["instance"]] == ["cpu0", "cpu1", "cpu2"]
    replaced = layout_edit.with_instance(added, {"name": "cpu9", "gpus": [], "port": 8109}, "cpu1")
    assert [t["name"] for t in tomllib.loads(replaced)["instance"]] == ["cpu0", "cpu9", "cpu2"]
    removed = layout_edit.without_instance(replaced, "cpu0")
    doc = tomllib.loads(removed)
    assert [t["name"] for t in doc["instance"]] == ["cpu9", "cpu2"]
    assert doc["defaults"] == tomllib.loads(text)["defaults"]
    with pytest.raises(KeyError):
        layout_edit.without_instance(removed, "cpu0")


def test_plan_text_names_what_starts_restarts_and_stops():
    assert (
        plan_text(ApplyPlan(start=("a",), stop=("b", "c"), unchanged=("d",)))
        == "start: a · stop: b, c"
    )
    assert plan_text(ApplyPlan()) == "nothing to start, restart or stop"


def test_log_tail_hides_the_access_lines_of_vsups_own_probes():
    from vsup.tui.widgets.detail import without_probes

    text = (
        'INFO:     127.0.0.1:59488 - "GET /health HTTP/1.1" 200 OK\n'
        'INFO:     127.0.0.1:59492 - "GET /metrics HTTP/1.1" 200 OK\n'
        'INFO:     127.0.0.1:40000 - "POST /v1/completions HTTP/1.1" 200 OK\n'
        "INFO 05-11 09:00:31 [api_server.py:1874] Starting vLLM server on http://0.0.0.0:8000\n"
    )
    assert without_probes(text) == "".join(text.splitlines(keepends=True)[2:])


def test_vsup_and_vsup_tui_parse_readonly_and_refresh():
    from vsup.cli import build_parser

    args = build_parser().parse_args(["tui", "--readonly", "--refresh", "2"])
    assert args.readonly is True and args.refresh == 2.0
    assert args.func.__module__ == "vsup.commands.tui"
    default = build_parser().parse_args(["tui"])
    assert default.readonly is False and default.refresh == 1.0


def test_vsup_tui_with_a_bad_keymap_says_so_before_touching_the_daemon(monkeypatch, capsys):
    from vsup.cli import build_parser

    monkeypatch.setenv("VSUP_KEYMAP", "reboot=R")
    monkeypatch.setenv("VSUP_TUI_CONFIG", "/nonexistent/tui.toml")
    args = build_parser().parse_args(["tui"])
    assert args.func(args) == 2
    assert "VSUP_KEYMAP: unknown key binding id(s) reboot" in capsys.readouterr().err


def test_exit_pane_of_a_failed_instance_says_why_vsup_gave_up():
    why = "processes of g1 outlived SIGKILL: 28258 VLLM::Worker (R: running, exiting)"
    text = exit_text(empty_instance("g1", state="failed", failed_why=why)).plain
    assert why in text and "crash loop" not in text
    # an older daemon's status has no why: the generic line stays
    assert "crash loop" in exit_text(empty_instance("g1", state="failed")).plain


def test_screens_and_widgets_never_import_the_app():
    """Issue 13: the dashboard reports up with messages; nothing below the app imports it
    (TYPE_CHECKING imports included), so tui/app.py <-> screens/dashboard.py stays untied."""
    import ast
    from pathlib import Path

    import vsup.tui

    root = Path(vsup.tui.__file__).parent
    offenders = []
    for path in [*root.glob("screens/*.py"), *root.glob("widgets/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "vsup.tui.app" for n in names):
                offenders.append(path.name)
    assert offenders == []
    source = (root / "screens" / "dashboard.py").read_text()
    assert "self.app." not in source.replace("self.app.size", "").replace(
        "self.app.batch_update", ""
    )


def test_gpu_advice_names_its_gpu_once():
    """GPU advice carries "GPU N:" itself; the pane adds it only to advice that does not."""
    said = advice_text(
        [
            Advice(kind="gpu_throttle", severity="info", gpu=0, message="GPU 0: held at its cap"),
            Advice(kind="x", severity="warning", gpu=3, message="something on it"),
        ],
        None,
    ).plain
    assert "GPU 0: GPU 0" not in said and "GPU 0: held at its cap" in said
    assert "GPU 3: something on it" in said
