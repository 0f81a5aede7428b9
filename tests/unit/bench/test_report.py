"""The side-by-side table, the markdown and the JSON of a bench run."""

from __future__ import annotations

import json
import math

from vsup.bench.report import dump_json, ratio_to_first, render_markdown, render_table

GiB = 1024**3


def run(
    name,
    out_tps,
    gpus_per_inst,
    outcome="ok",
    problems=(),
    pre=0,
    kv=0.5,
    hbm=None,
    completed=1000,
    duration=60.0,
):
    insts = [{"name": f"{name}-{i}", "gpus": g, "client": {"equivalent": f"vllm bench serve {i}"}}
             for i, g in enumerate(gpus_per_inst)]  # fmt: skip
    return {
        "layout": {"name": name, "path": f"/x/{name}.toml"},
        "outcome": outcome,
        "problems": list(problems),
        "instances": insts,
        "totals": {
            "prompts": completed,
            "completed": completed,
            "duration_s": duration,
            "failed": 0,
            "request_throughput": out_tps / 256,
            "output_throughput": out_tps,
            "ttft_ms": {"p50": 120.4, "p99": 900.0, "mean": 200.0},
            "tpot_ms": {"p50": 12.34, "p99": 40.0, "mean": 15.0},
            "preemptions": pre,
            "kv_peak": kv,
            "hbm_peak_bytes": hbm,
            "tokens_per_s_vsup": out_tps * 0.9,
        },
    }


def test_one_column_per_layout_with_the_ratio_to_the_first():
    runs = [
        run("2xtp1", 4000.0, [[0], [1]], hbm=int(250 * GiB)),
        run("1xtp2", 3000.0, [[0, 1]], pre=12, kv=1.0, hbm=int(260 * GiB)),
    ]
    ratio_to_first(runs)
    text = render_table(runs)
    lines = text.splitlines()
    assert lines[0].split() == ["2xtp1", "1xtp2"]
    rows = {line[:21].strip(): line[21:].split() for line in lines[2:]}
    assert rows["instances"] == ["2", "1"]
    assert rows["GPUs"] == ["0,1", "0,1"]
    assert rows["output tok/s (client)"] == ["4000.0", "3000.0"]
    assert rows["ratio to first"] == ["1.00x", "0.75x"]
    assert rows["TTFT p50 / p99 ms"] == ["120", "/", "900", "120", "/", "900"]
    assert rows["preemptions"] == ["0", "12"]
    assert rows["KV peak"] == ["50%", "100%"]
    assert rows["HBM peak"] == ["250.0G", "260.0G"]
    assert rows["vsup tok/s (10 s avg)"] == ["3600.0", "2700.0"]
    # samples large enough: no warning under the table
    assert not any(line.startswith(("*", "output tok/s (client) is")) for line in lines)


def test_a_ratio_from_too_small_a_sample_is_flagged_and_the_tok_s_figures_explained():
    """Issue 25: a bench of 8 prompts printed "3.82x" with no warning, and "vsup tok/s 1.2"
    beside the client's 28.0 with nothing saying what each measures."""
    runs = [
        run("one", 28.0, [[0]], completed=8, duration=1.3),
        run("two", 107.0, [[0], [1]], completed=8, duration=0.6),
    ]
    runs[0]["totals"]["tokens_per_s_vsup"] = 1.2
    ratio_to_first(runs)
    assert [r["ratio_small_sample"] for r in runs] == [True, True]
    lines = render_table(runs).splitlines()
    rows = {line[:21].strip(): line[21:].split() for line in lines[2:]}
    assert rows["ratio to first"] == ["1.00x*", "3.82x*"]
    (star,) = [line for line in lines if line.startswith("* ")]
    assert "too small a sample for the ratio to mean anything" in star
    assert "one 8 requests in 1.3 s, two 8 requests in 0.6 s" in star
    (tok,) = [line for line in lines if line.startswith("output tok/s (client) is")]
    assert "client's output tokens over its run time" in tok and "one: 1.3 s" in tok
    assert "Notes:" in render_markdown({"runs": runs, "workload": {}})
    # a small run compared with a large first run: the ratio is still flagged
    mixed = [run("big", 100.0, [[0]]), run("small", 90.0, [[0]], completed=8, duration=1.0)]
    ratio_to_first(mixed)
    assert [r["ratio_small_sample"] for r in mixed] == [False, True]


def test_a_layout_that_did_not_run_shows_dashes_and_its_problem_below():
    bad = {
        "layout": {"name": "broken"},
        "outcome": "invalid",
        "problems": ["does not validate: broken.toml:3: error: port clash"],
        "instances": [],
        "totals": None,
    }
    runs = [bad, run("good", 100.0, [[]])]
    ratio_to_first(runs)
    text = render_table(runs)
    rows = {line[:21].strip(): line[21:].split() for line in text.splitlines()[2:]}
    assert rows["outcome"] == ["invalid", "ok"]
    assert rows["output tok/s (client)"] == ["-", "100.0"]
    assert rows["ratio to first"] == ["-", "1.00x"]  # the first layout with a figure is 1.00x
    assert rows["GPUs"] == ["-", "cpu"]
    assert "broken: does not validate: broken.toml:3: error: port clash" in text


def test_markdown_has_the_workload_the_table_and_the_client_commands():
    runs = [run("a", 10.0, [[0]]), run("b", 20.0, [[0], [0]])]
    ratio_to_first(runs)
    doc = {
        "workload": {
            "num_prompts": 1000,
            "dataset": "random",
            "input_len": 512,
            "output_len": 256,
            "request_rate": "inf",
            "seed": 0,
        },  # fmt: skip
        "vllm_version": "0.26.0",
        "started_at": "2026-12-01T00:00:00Z",
        "runs": runs,
    }
    md = render_markdown(doc)
    assert "1000 prompts, random, 512 in / 256 out" in md
    assert "| | a | b |" in md.replace("|  |", "| |")
    assert "| ratio to first | 1.00x | 2.00x |" in md
    assert "- b / b-1: `vllm bench serve 1`" in md


def test_json_says_inf_as_a_string():
    text = dump_json({"rate": math.inf, "runs": [{"x": [math.nan]}]})
    assert json.loads(text) == {"rate": "inf", "runs": [{"x": ["nan"]}]}
