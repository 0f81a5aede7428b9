"""parse_metrics on payloads captured from the real CPU vLLM 0.32, legacy names, several
engines, and garbage; checked against a reference built on prometheus_client's full parse."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from vsup.telemetry import metrics as M
from vsup.telemetry.metrics import EngineFigures, kv_capacity_tokens, parse_metrics

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
IDLE = (FIX / "metrics_idle.txt").read_text()
LOAD = (FIX / "metrics_load.txt").read_text()
LEGACY = (FIX / "metrics_load_legacy_names.txt").read_text()


def reference(text: str) -> dict:
    """The same reading done the slow way: every family through prometheus_client."""
    by_name: dict[str, list] = {}
    start = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            by_name.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
            if s.name == M.START_TIME:
                start = float(s.value)

    def total(*names: str):
        for n in names:
            rows = [v for _l, v in by_name.get(n, ()) if math.isfinite(v)]
            if n in by_name:
                return sum(rows) if rows else None
        return None

    configs: dict[str, Mapping[str, str]] = {}
    for labels, _v in by_name.get(M.CACHE_CONFIG, ()):
        configs.setdefault(labels.get("engine", ""), labels)
    caps = {e: kv_capacity_tokens(c) or 0 for e, c in configs.items()}  # 0: unknown
    kv_rows = by_name.get(M.KV_USAGE) or by_name.get(M.KV_USAGE_LEGACY) or []
    kv_rows = [(lab.get("engine", ""), v) for lab, v in kv_rows if math.isfinite(v)]
    if not kv_rows:
        kv = None
    elif len(kv_rows) == 1:
        kv = kv_rows[0][1]
    elif all(caps.get(e) for e, _v in kv_rows):
        kv = sum(v * caps[e] for e, v in kv_rows) / sum(caps[e] for e, _v in kv_rows)
    else:
        kv = sum(v for _e, v in kv_rows) / len(kv_rows)
    return {
        "kv_cache_usage": kv,
        "preemptions_total": total(M.PREEMPTIONS),
        "requests_running": total(M.RUNNING),
        "requests_waiting": total(M.WAITING),
        "prompt_tokens_total": total(M.PROMPT_TOKENS),
        "generation_tokens_total": total(M.GENERATION_TOKENS),
        "request_success_total": total(M.REQUEST_SUCCESS),
        "prefix_cache_queries_total": total(M.PREFIX_QUERIES, M.PREFIX_QUERIES_LEGACY),
        "prefix_cache_hits_total": total(M.PREFIX_HITS, M.PREFIX_HITS_LEGACY),
        "kv_capacity_tokens": (
            sum(caps.values()) if caps and all(c is not None for c in caps.values()) else None
        ),
        "process_start_time_s": start,
    }


def view(m: M.VllmMetrics) -> dict:
    return {k: getattr(m, k) for k in reference("")}


def per_engine_reference(text: str) -> dict:
    """Each engine's figures the slow way (every family through prometheus_client)."""
    out: dict[str, dict] = {}
    wanted = {
        M.RUNNING: "requests_running",
        M.WAITING: "requests_waiting",
        M.PROMPT_TOKENS: "prompt_tokens_total",
        M.GENERATION_TOKENS: "generation_tokens_total",
        M.REQUEST_SUCCESS: "request_success_total",
    }
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            engine = s.labels.get("engine", "")
            one = out.setdefault(engine, {})
            if s.name in wanted and math.isfinite(s.value):
                one[wanted[s.name]] = one.get(wanted[s.name], 0.0) + s.value
            elif s.name == M.KV_USAGE:
                one["kv_cache_usage"] = s.value
            elif s.name == M.SLEEP_STATE and s.labels.get("sleep_state") == "awake":
                one["sleeping"] = s.value == 0
    return {e: one for e, one in out.items() if one}


@pytest.mark.parametrize(
    "name",
    [
        "metrics_idle.txt",
        "metrics_load.txt",
        "metrics_load_next.txt",
        "metrics_load_legacy_names.txt",
        "dp2/metrics_dp_idle.txt",
        "dp2/metrics_dp1_frozen_idle.txt",
        "dp2/metrics_dp1_frozen_load.txt",
    ],
)
def test_captured_payloads_read_the_same_as_a_full_prometheus_client_parse(name: str) -> None:
    text = (FIX / name).read_text()
    m = parse_metrics(text)
    assert view(m) == pytest.approx(reference(text))
    if "legacy" not in name:
        got = {
            e: {k: v for k, v in vars(f).items() if v is not None} for e, f in m.per_engine.items()
        }
        want = per_engine_reference(text)
        assert set(got) == set(want)
        for engine, figures in want.items():
            assert got[engine] == pytest.approx(figures)
        assert tuple(m.per_engine) == m.engines


def test_each_data_parallel_rank_keeps_its_own_figures() -> None:
    m = parse_metrics((FIX / "dp2" / "metrics_dp1_frozen_load.txt").read_text())
    zero, one = m.per_engine["0"], m.per_engine["1"]
    assert (zero.requests_running, one.requests_running) == (8.0, 8.0)
    assert (zero.generation_tokens_total, one.generation_tokens_total) == (3304.0, 301.0)
    assert m.generation_tokens_total == 3605.0
    assert zero.busy and one.busy and zero.requests == 8.0
    assert EngineFigures().busy is None and EngineFigures().requests is None


def test_idle_payload_from_cpu_vllm_032() -> None:
    m = parse_metrics(IDLE)
    assert m.kv_cache_usage == 0.0
    assert m.preemptions_total == 0.0
    assert (m.requests_running, m.requests_waiting) == (0.0, 0.0)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (2.0, 8.0)
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (2.0, 0.0)
    assert m.kv_capacity_tokens == 1048576  # kv_cache_size_tokens; also 8192 blocks x 128
    assert m.cache_config is not None
    assert m.cache_config["block_size"] == "128"
    assert m.cache_config["gpu_memory_utilization"] == "0.92"
    assert m.engines == ("0",) and m.model_names == ("/models/tiny-llama",)
    assert m.process_start_time_s == pytest.approx(1.79599062741e09)
    assert m.legacy_names == () and m.vllm_seen and m.found and m.bad_lines == 0
    assert m.prefix_cache_hit_rate == 0.0


def test_payload_under_load_shows_preemptions_full_cache_and_a_queue() -> None:
    m = parse_metrics(LOAD)
    assert m.preemptions_total and m.preemptions_total > 0
    assert m.kv_cache_usage and m.kv_cache_usage > 0
    assert m.requests_waiting and m.requests_waiting > 0
    assert m.requests_running and m.requests_running > 0
    # --num-gpu-blocks-override 6 with block size 128
    assert m.cache_config is not None
    assert m.cache_config["num_gpu_blocks"] == "6"
    assert m.kv_capacity_tokens == kv_capacity_tokens(m.cache_config)


def test_legacy_names_before_012_are_read_and_reported() -> None:
    new, old = parse_metrics(LOAD), parse_metrics(LEGACY)
    assert "vllm:gpu_cache_usage_perc" in LEGACY and "vllm:kv_cache_usage_perc" not in LEGACY
    assert old.kv_cache_usage == new.kv_cache_usage
    assert old.prefix_cache_queries_total == new.prefix_cache_queries_total
    assert old.prefix_cache_hits_total == new.prefix_cache_hits_total
    assert set(old.legacy_names) == {
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
    }
    assert new.legacy_names == ()


def test_current_name_wins_when_a_payload_has_both_eras() -> None:
    text = 'vllm:gpu_cache_usage_perc{engine="0"} 0.9\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
    m = parse_metrics(text)
    assert m.kv_cache_usage == 0.25 and m.legacy_names == ()


def _second_engine(text: str, engine: str = "1") -> str:
    """The real payload's vLLM lines again, for another engine (data parallelism)."""
    lines = [
        ln.replace('engine="0"', f'engine="{engine}"')
        for ln in text.splitlines()
        if ln.startswith("vllm:") and 'engine="0"' in ln
    ]
    return text + "\n".join(lines) + "\n"


def test_several_engines_sum_counters_and_weigh_kv_usage_by_capacity() -> None:
    one = parse_metrics(LOAD)
    text = _second_engine(LOAD)
    # engine 1 has twice the blocks and an empty cache
    line1 = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("vllm:cache_config_info") and 'engine="1"' in ln
    )
    text = text.replace(
        line1,
        line1.replace('num_gpu_blocks="6"', 'num_gpu_blocks="12"').replace(
            'kv_cache_size_tokens="768"', 'kv_cache_size_tokens="1536"'
        ),
    )
    text = re.sub(r'(vllm:kv_cache_usage_perc\{engine="1"[^}]*\}) \S+', r"\1 0.0", text)
    both = parse_metrics(text)
    assert both.engines == ("0", "1")
    assert one.preemptions_total is not None and one.generation_tokens_total is not None
    assert one.requests_waiting is not None
    assert both.preemptions_total == 2 * one.preemptions_total
    assert both.generation_tokens_total == 2 * one.generation_tokens_total
    assert both.requests_waiting == 2 * one.requests_waiting
    cap0 = one.kv_capacity_tokens
    assert cap0 is not None
    assert one.cache_config is not None and one.kv_cache_usage is not None
    cap1 = 12 * int(one.cache_config["block_size"])
    assert both.kv_capacity_tokens == cap0 + cap1
    assert both.kv_cache_usage == pytest.approx(one.kv_cache_usage * cap0 / (cap0 + cap1))
    assert view(both) == pytest.approx(reference(text))


def test_unknown_capacity_falls_back_to_a_plain_mean() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.6\n'
        'vllm:num_preemptions_total{engine="0"} NaN\n'
        'vllm:num_preemptions_total{engine="1"} 3\n'
    )
    m = parse_metrics(text)
    assert m.kv_cache_usage == pytest.approx(0.4)
    assert m.preemptions_total == 3  # NaN is unknown, not a number to add
    assert m.kv_capacity_tokens is None and m.cache_config is None


@pytest.mark.parametrize(
    "labels, tokens",
    [
        ({"kv_cache_size_tokens": "1048576", "num_gpu_blocks": "8", "block_size": "16"}, 1048576),
        ({"kv_cache_size_tokens": "None", "num_gpu_blocks": "8", "block_size": "16"}, 128),
        ({"num_gpu_blocks": "2048", "block_size": "16"}, 32768),
        ({"num_gpu_blocks": "None", "block_size": "16"}, None),
        ({"block_size": "16"}, None),
        ({}, None),
        ({"kv_cache_size_tokens": "nan"}, None),
    ],
)
def test_kv_capacity_reads_cache_config_by_key(labels: dict, tokens: int | None) -> None:
    assert kv_capacity_tokens(labels) == tokens


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "\x00\x01\x02",
        "<html><body>404</body></html>",
        "vllm:",
        "{{{{",
        "# HELP vllm:kv_cache_usage_perc x\n# TYPE vllm:kv_cache_usage_perc gauge\n",
    ],
)
def test_garbage_gives_nulls_without_raising(text: str) -> None:
    m = parse_metrics(text)
    assert not m.found
    assert m.kv_cache_usage is None and m.preemptions_total is None


def test_disable_log_stats_payload_has_no_vllm_metrics() -> None:
    python_only = "\n".join(ln for ln in IDLE.splitlines() if "vllm:" not in ln) + "\n"
    m = parse_metrics(python_only)
    assert not m.vllm_seen and not m.found
    assert m.process_start_time_s == pytest.approx(1.79599062741e09)


def test_malformed_wanted_lines_are_counted_and_skipped() -> None:
    text = 'vllm:num_requests_running{engine="0" 5\nvllm:num_requests_waiting{engine="0"} 7\n'
    m = parse_metrics(text)
    assert m.requests_running is None and m.requests_waiting == 7 and m.bad_lines == 1


def test_only_exact_family_names_match() -> None:
    text = (
        "# HELP vllm:num_preemptions_total Cumulative number of preemption.\n"
        'vllm:num_preemptions_total_by_reason{engine="0"} 99\n'
        "vllm:num_preemptions_totalx 98\n"
        "xvllm:num_preemptions_total 97\n"
        'other{msg="\\nvllm:num_preemptions_total 96"} 1\n'
        'vllm:num_preemptions_total{engine="0"} 4\n'
    )
    assert parse_metrics(text).preemptions_total == 4


def test_first_line_and_crlf_line_endings() -> None:
    text = 'vllm:num_requests_running{engine="0"} 2\r\nvllm:num_requests_waiting 3\r\n'
    m = parse_metrics(text)
    assert (m.requests_running, m.requests_waiting) == (2.0, 3.0)


REAL_LINES = LOAD.splitlines()
TRICKY = [
    'vllm:kv_cache_usage_perc{engine="7",model_name="a \\"q\\", b}"} 0.5',
    'vllm:num_requests_running{engine="7",model_name="x\\ny"} 1e0',
    'vllm:generation_tokens_total{engine="7",model_name="m"} +Inf',
    'vllm:prompt_tokens_total{engine="7",model_name="m"} 1.5e+03 1700000000000',
    'vllm:num_requests_waiting{ engine = "7" , model_name="m", } 2',
    'vllm:cache_config_info{block_size="16",engine="7",num_gpu_blocks="10"} 1.0',
    'unrelated{v="\\nvllm:num_requests_running{engine=\\"9\\"} 5"} 1',
    "# vllm:num_requests_running 42",
]


WANTED_REAL = [
    ln for ln in REAL_LINES if ln.split("{")[0].split(" ")[0] in M.VLLM_FAMILIES + (M.START_TIME,)
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(REAL_LINES), st.sampled_from(WANTED_REAL + TRICKY)),
        min_size=0,
        max_size=80,
    )
)
def test_any_mix_of_real_and_tricky_lines_matches_the_reference(lines: list[str]) -> None:
    """Every example is compared: prometheus_client reads every mix of these lines (none of
    20,000 random mixes was refused); one it refused would fail here, not pass unchecked."""
    text = "\n".join(lines) + "\n"
    expected = reference(text)
    assert view(parse_metrics(text)) == pytest.approx(expected, nan_ok=True)


def test_the_benchmark_prints_its_figures_on_its_last_line(capsys) -> None:
    from benchmarks.metrics_parse import main

    assert main(["--iterations", "20"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"parse_ms=[\d.]+ baseline_ms=[\d.]+ ratio=[\d.]+", last)


def test_a_sleep_in_flight_and_the_sleep_state_gauge_are_read() -> None:
    # captured: the engine busy (frozen) with a /sleep the API server holds; the gauge still
    # says awake (vLLM sets it once the sleep is done)
    text = (FIX / "metrics_sleep_in_flight.txt").read_text()
    m = parse_metrics(text)
    assert (m.sleeps_in_flight, m.wakes_in_flight) == (1.0, None)
    assert (m.sleeping, m.sleep_level) == (False, None)
    # the same server once asleep at level 1 (the three series as vLLM sets them)
    asleep = re.sub(r'(sleep_state="awake"\}) 1\.0', r"\1 0.0", text)
    asleep = re.sub(r'(sleep_state="weights_offloaded"\}) 0\.0', r"\1 1.0", asleep)
    asleep = asleep.replace('{operation="sleep"} 1.0', '{operation="sleep"} 0.0')
    m = parse_metrics(asleep)
    assert (m.sleeping, m.sleep_level, m.sleeps_in_flight) == (True, 1, 0.0)
    assert m.per_engine["0"].sleeping is True
    # an awake server that never slept: no call counted
    m = parse_metrics(LOAD)
    assert (m.sleeping, m.sleep_level, m.sleeps_in_flight, m.wakes_in_flight) == (
        False,
        None,
        None,
        None,
    )
    # no sleep families at all (vLLM 0.26): nothing known
    older = "\n".join(line for line in LOAD.splitlines() if "sleep" not in line)
    m = parse_metrics(older)
    assert (m.sleeping, m.sleep_level, m.sleeps_in_flight) == (None, None, None)
