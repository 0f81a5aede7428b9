"""What `vsup tune` prints says what was measured (issue 35 item 14): without `--slo` no word of
an SLO and no goodput column; the plots label each point with its rank in the table; the axes
start at 0, so a gap inside the noise does not fill the plot."""

from __future__ import annotations

import re
import xml.dom.minidom

from vsup.tune.report import (
    best_layout_text,
    build_document,
    render_markdown,
    render_svg,
    render_table,
    render_terminal_plot,
)
from vsup.tune.search import SearchResult, Step

from tests.unit.tune.test_tune_report import cand, document, run, step


def no_slo_run(thr: float, ttft_p99: float) -> dict:
    """A run judged without an SLO (tune/slo.py `judge(None, ...)`): met when none failed."""
    r = run(thr, ttft_p99, 5.0, True)
    r["slo"] = {"goodput": 5.0, "met": True, "terms": []}
    return r


def no_slo_document(runs: dict[int, dict]) -> dict:
    cands = [cand(i, 8 * i) for i in sorted(runs)]
    # without an SLO the score is the output throughput (tune/measure.py)
    steps = [Step(i, 0, 50, 0, "ok", r["totals"]["output_throughput"], r["slo"]["met"], 5.0, 1.0, r)
             for i, r in sorted(runs.items())]  # fmt: skip
    header = {
        "base_layout": {"name": "base", "path": "/x/base.toml"},
        "workload": {"num_prompts": 50, "seed": 7},
        "search": {"method": "grid", "eta": 2, "rungs": [50], "repeats": 1, "budget_s": None},
    }
    result = SearchResult(steps, sorted(runs), {}, {}, False)
    return build_document(header=header, candidates=cands, steps=steps, result=result, slo=None,
                          rungs=[50], repeats=1, margin=0.05)  # fmt: skip


def test_without_an_slo_nothing_speaks_of_one():
    doc = no_slo_document({1: no_slo_run(400, 300), 2: no_slo_run(500, 320)})
    table = render_table(doc)
    assert "SLO" not in table.replace("no SLO", "")
    assert "goodput" not in table.splitlines()[0]
    assert "best (most output tokens/s" in table and ": base-mns16 (" in table
    md = render_markdown(doc)
    assert "goodput" not in md.split("## Candidates")[0]
    assert "under the SLO" not in md and "**Best (most output tokens/s" in md
    text = best_layout_text(doc, cand(2, 16).toml, "best.toml")
    assert "goodput" not in text and "500.0 output tok/s" in text


def test_without_an_slo_a_failed_request_is_the_reason_not_the_slo():
    bad = no_slo_run(300, 300)
    bad["slo"]["met"] = False
    bad["totals"]["failed"] = 3
    doc = no_slo_document({1: no_slo_run(400, 300), 2: bad})
    by = {c["name"]: c for c in doc["candidates"]}
    assert by["base-mns16"]["reason"] == "ruled out: 3 request(s) failed"


def test_with_an_slo_the_goodput_column_and_words_stay():
    doc = document([step(1, 0, 0, run(500, 300, 4.0, True), 50)], [cand(1, 8)], finished=[1])
    table = render_table(doc)
    assert "goodput r/s" in table.splitlines()[0] and "best under the SLO: base-mns8" in table


def test_plot_labels_are_the_ranks():
    # candidate 1 has less throughput: rank 2; candidate 2 is rank 1
    doc = no_slo_document({1: no_slo_run(400, 300), 2: no_slo_run(500, 600)})
    assert doc["ranking"] == ["base-mns16", "base-mns8"]
    plot = render_terminal_plot(doc)
    legend = [ln.split() for ln in plot.splitlines() if re.match(r"^  [* ] \w ", ln)]
    assert [ln[-2:] for ln in legend] == [["1", "base-mns16"], ["2", "base-mns8"]]
    rows = [ln.split("|", 1)[1] for ln in plot.splitlines() if "|" in ln]
    top = next(r for r in rows if r.strip())  # higher latency is nearer the top: rank 1's
    assert top.strip() == "1"
    svg = xml.dom.minidom.parseString(render_svg(doc))
    texts = [t.firstChild.data for t in svg.getElementsByTagName("text") if t.firstChild]
    svg_legend = [t.rstrip(" *") for t in texts if t.rstrip(" *").endswith(("mns16", "mns8"))]
    assert svg_legend == ["1 base-mns16", "2 base-mns8"]
    assert texts.count("1") == 1 and texts.count("2") == 1  # the points' labels


def test_a_gap_inside_the_noise_does_not_fill_the_plot():
    # 2 % apart in throughput, 3 % in latency: the same spot, not the two ends of the plot
    doc = no_slo_document({1: no_slo_run(500, 300), 2: no_slo_run(510, 309)})
    plot = render_terminal_plot(doc, width=56)
    cols = {}
    for ln in plot.splitlines():
        if "|" not in ln:
            continue
        grid = ln.split("|", 1)[1]
        for mark in "12":
            if mark in grid:
                cols[mark] = grid.index(mark)
    assert set(cols) == {"1", "2"}
    assert abs(cols["1"] - cols["2"]) <= 56 * 0.05, plot
    assert "\n          0.0" in plot  # the x axis starts at 0
    svg = xml.dom.minidom.parseString(render_svg(doc))
    cx = [float(c.getAttribute("cx")) for c in svg.getElementsByTagName("circle")]
    assert abs(cx[0] - cx[1]) <= 0.05 * 440
