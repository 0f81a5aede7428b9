"""The tune's document and what is rendered from it: ranking, front, warnings, table, markdown,
plots, and the chosen layout's file (which must validate as written)."""

from __future__ import annotations

import tomllib
import xml.dom.minidom

import pytest

from vsup.layout.compiled import compile_layout
from vsup.layout.node import NodeFacts
from vsup.tune.report import (
    best_layout_text,
    build_document,
    render_markdown,
    render_svg,
    render_table,
    render_terminal_plot,
)
from vsup.tune.search import SearchResult, Step
from vsup.tune.slo import parse_slo
from vsup.tune.space import Candidate, Knobs

TOML = """[layout]
name = "{name}"

[defaults]
model = "org/model"
args = {{ max-num-seqs = {seqs} }}

[[instance]]
name = "cpu0"
gpus = []
port = 8100
"""


def cand(index: int, seqs: int, pruned: str | None = None) -> Candidate:
    name = f"base-mns{seqs}"
    return Candidate(index, name, Knobs(1, None, (("max-num-seqs", seqs),)),
                     TOML.format(name=name, seqs=seqs), pruned=pruned)  # fmt: skip


def run(thr: float, ttft_p99: float, goodput: float, met: bool, completed: int = 100) -> dict:
    return {
        "outcome": "ok",
        "problems": [],
        "instances": [
            {"name": "cpu0", "seed": 7, "client": {"command": "python -c ...",
                                                   "equivalent": "vllm bench serve --seed 7"}}
        ],  # fmt: skip
        "totals": {
            "completed": completed,
            "failed": 0,
            "duration_s": 20.0,
            "output_throughput": thr,
            "request_throughput": completed / 20.0,
            "ttft_ms": {"p50": ttft_p99 / 2, "p99": ttft_p99},
            "tpot_ms": {"p50": 10.0, "p99": 20.0},
            "e2el_ms": {"p50": 900.0, "p99": 1500.0},
        },
        "slo": {"goodput": goodput, "met": met,
                "terms": [{"slo": "ttft_p99<=1s", "value_ms": ttft_p99, "holds": met}]},
        "energy": {"tokens_per_joule": None, "why": "CPU instances: there is no GPU power to read"},
    }  # fmt: skip


def step(c: int, rung: int, rep: int, r: dict, prompts: int = 100) -> Step:
    return Step(c, rung, prompts, rep, r["outcome"], r["slo"]["goodput"], r["slo"]["met"], 5.0,
                1.0, r)  # fmt: skip


def document(steps: list[Step], cands: list[Candidate], finished: list[int]) -> dict:
    header = {
        "base_layout": {"name": "base", "path": "/x/base.toml"},
        "workload": {"num_prompts": 100, "seed": 7},
        "search": {"method": "asynchronous successive halving", "eta": 2, "rungs": [50, 100],
                   "repeats": 2, "budget_s": None, "elapsed_s": 1.0},
        "ended_at": "now",
    }  # fmt: skip
    result = SearchResult(steps, finished, {}, {4: "the time budget ran out"}, False)
    return build_document(header=header, candidates=cands, steps=steps, result=result,
                          slo=parse_slo("ttft_p99<=1s"), rungs=[50, 100], repeats=2,
                          margin=0.05)  # fmt: skip


def test_ranking_front_statuses_and_noise():
    cands = [cand(1, 8), cand(2, 1), cand(3, 16), cand(4, 32), cand(5, 999, pruned="too big")]
    steps = [
        step(1, 0, 0, run(500, 300, 4.0, True), 50),
        step(1, 1, 0, run(520, 310, 4.9, True)),
        step(1, 1, 1, run(480, 330, 4.7, True)),
        step(2, 0, 0, run(100, 3000, 0.2, False), 50),  # ruled out by the SLO
        step(3, 0, 0, run(530, 320, 5.0, True), 50),
        step(3, 1, 0, run(540, 350, 4.8, True)),
        step(3, 1, 1, run(500, 340, 5.0, True)),
    ]
    doc = document(steps, cands, finished=[1, 3])
    by = {c["name"]: c for c in doc["candidates"]}
    assert doc["ranking"] == ["base-mns16", "base-mns8", "base-mns1"]
    assert by["base-mns16"]["figures"]["goodput"] == 4.9  # the median of its two runs
    assert by["base-mns8"]["figures"]["spread"]["goodput"] == pytest.approx((4.9 - 4.7) / 4.8)
    assert by["base-mns1"]["status"] == "slo_violated" and "got 3.00s" in by["base-mns1"]["reason"]
    assert by["base-mns32"]["status"] == "skipped" and "budget" in by["base-mns32"]["reason"]
    assert by["base-mns999"]["status"] == "pruned"
    assert doc["best"]["name"] == "base-mns16"
    # 16 (more throughput, more latency) and 8 (less of both) are both on the front
    assert doc["pareto"]["front"] == ["base-mns8", "base-mns16"]
    assert not by["base-mns1"]["pareto"]
    # 4.9 against 4.7... the best two are within their spread: said so
    assert any("inside the noise" in w for w in doc["warnings"]), doc["warnings"]
    assert by["base-mns16"]["clients"][0]["equivalent"] == "vllm bench serve --seed 7"


def test_a_crashed_candidate_keeps_its_reason():
    bad = run(0, 0, 0, False)
    bad.update(outcome="not_ready", problems=["cpu0: failed (last exit: oom) after 12 s"])
    doc = document([step(1, 0, 0, bad, 50)], [cand(1, 8)], finished=[])
    (c,) = doc["candidates"]
    assert c["status"] == "crashed" and "oom" in c["reason"] and doc["best"] is None


def test_the_renderings_say_the_same_as_the_document(tmp_path):
    cands = [cand(1, 8), cand(2, 1)]
    steps = [
        step(1, 0, 0, run(500, 300, 4.0, True, completed=10), 50),
        step(1, 1, 0, run(520, 310, 4.9, True, completed=10)),
        step(2, 0, 0, run(100, 3000, 0.2, False, completed=10), 50),
    ]
    doc = document(steps, cands, finished=[1])
    table = render_table(doc)
    assert table.splitlines()[0].split()[:3] == ["rank", "candidate", "status"]
    assert "best under the SLO: base-mns8" in table and "warning: small sample" in table
    assert "| 2 | base-mns1 | slo_violated |" in render_markdown(doc)
    plot = render_terminal_plot(doc)
    assert "SLO limit 1.00s" in plot and "* 1 base-mns8" in plot and "  2 base-mns1" in plot
    xml.dom.minidom.parseString(render_svg(doc))
    text = best_layout_text(doc, cands[0].toml, "best.toml")
    assert text.startswith("# Chosen by `vsup tune`") and "Runner-up: base-mns1" in text
    assert tomllib.loads(text)["layout"]["name"] == "base-mns8"
    compiled, diags = compile_layout(text, tmp_path / "best.toml", NodeFacts())
    assert compiled is not None, [d.format() for d in diags]


def test_a_candidate_the_search_never_decided_on_is_interrupted_not_cut():
    cands = [cand(1, 8), cand(2, 1)]
    steps = [step(1, 0, 0, run(500, 300, 4.0, True), 50), step(2, 0, 0, run(400, 300, 3, True), 50)]
    header = {"base_layout": {"name": "b", "path": "/b.toml"}, "workload": {}, "search": {}}
    result = SearchResult(steps, [], {}, {}, False, cut=[2])
    doc = build_document(header=header, candidates=cands, steps=steps, result=result,
                         slo=parse_slo("ttft_p99<=1s"), rungs=[50, 100], repeats=2,
                         margin=0.05)  # fmt: skip
    first, second = doc["candidates"]
    assert first["status"] == "interrupted" and second["status"] == "cut"
    assert "below the rung's cut-off" in second["reason"]
