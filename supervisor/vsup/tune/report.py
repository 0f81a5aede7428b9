"""A tune's output: the document (what `--json` writes), and what is rendered from it: the ranked
table, markdown, the throughput/latency plot (SVG written here; PNG through matplotlib when it is
installed), a plot for the terminal, and the chosen layout's file with its comment block.

Everything printed is rendered from the document, so what is shown is what is saved. A
candidate's figures are those of the last rung it ran (the median of its repeats there); the
rung is in the table, since figures of a smaller rung are rougher.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vsup.bench.report import MIN_RATIO_DURATION_S, MIN_RATIO_REQUESTS
from vsup.tune.pareto import Point, front
from vsup.tune.search import SearchResult, Step
from vsup.tune.slo import Slo
from vsup.tune.space import Candidate

SCHEMA = 1
CRASHED = ("not_ready", "failed", "partial", "invalid")


# -- the document --------------------------------------------------------------------------


def _median(xs: Sequence[float | None]) -> float | None:
    known = sorted(x for x in xs if x is not None)
    if not known:
        return None
    mid = len(known) // 2
    return known[mid] if len(known) % 2 else (known[mid - 1] + known[mid]) / 2


def _spread(xs: Sequence[float | None]) -> float | None:
    """(max - min) / median of the repeats, None below two."""
    known = [x for x in xs if x is not None]
    med = _median(known)
    if len(known) < 2 or not med:
        return None
    return (max(known) - min(known)) / med


def _step_json(step: Step) -> dict[str, Any]:
    return {
        "rung": step.rung,
        "prompts": step.prompts,
        "repeat": step.repeat,
        "outcome": step.outcome,
        "score": step.score,
        "slo_met": step.slo_met,
        "seconds": round(step.seconds, 1),
        "problems": list(step.result.get("problems", ())),
        "run": step.result,
    }


def _figures(steps: Sequence[Step]) -> dict[str, Any]:
    """The median figures of the steps (one rung's repeats) and their spread."""
    runs = [s.result for s in steps]
    tot = [r.get("totals") or {} for r in runs]

    def pick(f: Any) -> list[float | None]:
        return [f(t, r) for t, r in zip(tot, runs, strict=True)]

    goodput = pick(lambda t, r: (r.get("slo") or {}).get("goodput"))
    thr = pick(lambda t, r: t.get("output_throughput"))
    tpj = pick(lambda t, r: (r.get("energy") or {}).get("tokens_per_joule"))
    ttft = pick(lambda t, r: (t.get("ttft_ms") or {}).get("p99"))
    return {
        "goodput": _median(goodput),
        "output_throughput": _median(thr),
        "request_throughput": _median(pick(lambda t, r: t.get("request_throughput"))),
        "ttft_p50_ms": _median(pick(lambda t, r: (t.get("ttft_ms") or {}).get("p50"))),
        "ttft_p99_ms": _median(ttft),
        "tpot_p50_ms": _median(pick(lambda t, r: (t.get("tpot_ms") or {}).get("p50"))),
        "tpot_p99_ms": _median(pick(lambda t, r: (t.get("tpot_ms") or {}).get("p99"))),
        "e2el_p99_ms": _median(pick(lambda t, r: (t.get("e2el_ms") or {}).get("p99"))),
        "tokens_per_joule": _median(tpj),
        "energy_why": next(
            ((r.get("energy") or {}).get("why") for r in runs if r.get("energy")), None
        ),
        "completed": sum(int(t.get("completed") or 0) for t in tot),
        "failed": sum(int(t.get("failed") or 0) for t in tot),
        "duration_s": _median(pick(lambda t, r: t.get("duration_s"))),
        "spread": {
            "goodput": _spread(goodput),
            "output_throughput": _spread(thr),
            "ttft_p99_ms": _spread(ttft),
        },
        "repeats": len(steps),
        "values": {"goodput": goodput, "output_throughput": thr, "ttft_p99_ms": ttft},
    }


def _latency(slo: Slo | None, steps: Sequence[Step], figures: dict[str, Any]) -> float | None:
    """The plot's latency: the SLO's first term's value, else TTFT p99."""
    if slo is None:
        return figures.get("ttft_p99_ms")
    vals = [((s.result.get("slo") or {}).get("terms") or [{}])[0].get("value_ms") for s in steps]
    return _median(vals)


def candidate_summary(
    cand: Candidate, steps: Sequence[Step], result: SearchResult | None, slo: Slo | None, last: int
) -> dict[str, Any]:
    doc: dict[str, Any] = {**cand.to_json(), "status": None, "reason": None, "rung": None}
    doc["steps"] = [_step_json(s) for s in steps]
    if cand.pruned:
        return {**doc, "status": "pruned", "reason": cand.pruned}
    if not steps:
        why = (result.skipped.get(cand.index) if result else None) or "never ran"
        return {**doc, "status": "skipped", "reason": why}
    final = steps[-1]
    doc["rung"] = final.rung
    doc["prompts"] = final.prompts
    if final.outcome != "ok":
        status = "interrupted" if final.outcome == "interrupted" else "crashed"
        problems = final.result.get("problems") or [final.outcome]
        reason = f"{final.outcome} at rung {final.rung}: " + "; ".join(problems)
        return {**doc, "status": status, "reason": reason, "outcome": final.outcome}
    rung_steps = [s for s in steps if s.rung == final.rung and s.outcome == "ok"]
    doc.update(_measured(rung_steps, slo))
    if not doc["slo_met"]:
        return {**doc, "status": "slo_violated", "reason": _ruled_out(doc, slo)}
    decided, said = _decision(cand, final, result)
    return {**doc, "status": decided, "reason": said}


def _measured(rung_steps: list[Step], slo: Slo | None) -> dict[str, Any]:
    """The figures of a candidate's last rung (its ok steps), against the SLO."""
    figures = _figures(rung_steps)
    return dict(
        figures=figures,
        slo_met=all(s.slo_met for s in rung_steps),
        slo_terms=(rung_steps[-1].result.get("slo") or {}).get("terms"),
        latency_ms=_latency(slo, rung_steps, figures),
        score=_median([s.score for s in rung_steps]),
        small_sample=figures["completed"] / max(1, len(rung_steps)) < MIN_RATIO_REQUESTS
        or (figures["duration_s"] or 0.0) < MIN_RATIO_DURATION_S,
        clients=[
            {
                "instance": i.get("name"),
                "seed": i.get("seed"),
                "command": (i.get("client") or {}).get("command"),
                "equivalent": (i.get("client") or {}).get("equivalent"),
                "reused_process": (i.get("client") or {}).get("reused_process"),
            }
            for i in rung_steps[-1].result.get("instances", ())
        ],
    )


def _ruled_out(doc: dict[str, Any], slo: Slo | None) -> str:
    """Why a measured candidate that did not meet the SLO is out."""
    broken = [
        f"{t['slo']} (got {_ms(t['value_ms'])})" for t in doc["slo_terms"] or () if not t["holds"]
    ]
    if slo is None:  # no SLO: a candidate must answer every request
        failed = doc["figures"]["failed"]
        return f"ruled out: {failed} request(s) failed" if failed else "ruled out: no request"
    return "ruled out by the SLO: " + (", ".join(broken) or "requests failed")


def _decision(cand: Candidate, final: Step, result: SearchResult | None) -> tuple[str, str | None]:
    """What the search decided on a candidate that met the SLO where it stopped."""
    if result is not None and cand.index in result.finished:
        return "finished", None
    if result is not None and result.budget_stopped == cand.index:
        return "cut", f"stopped after rung {final.rung + 1}: the time budget ran out"
    if result is not None and cand.index in result.cut:
        return "cut", f"cut after rung {final.rung + 1}: below the rung's cut-off"
    # measured, but the search ended (an interrupt) before it decided on it
    return "interrupted", f"stopped after rung {final.rung + 1}"


def rank(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Candidates with figures, best first: meeting the SLO, then the rung reached (figures of
    the full workload before those of a smaller rung), then the score."""
    measured = [c for c in cands if c.get("figures")]
    measured.sort(key=lambda c: (not c["slo_met"], -(c["rung"] or 0), -(c["score"] or 0.0)))
    for n, c in enumerate(measured, 1):
        c["rank"] = n
    return measured


def mark_front(cands: list[dict[str, Any]]) -> list[str]:
    """Mark each candidate's `pareto` and return the front's names (throughput ascending)."""
    points = [
        Point(c["index"], c["figures"]["output_throughput"], c.get("latency_ms"))
        for c in cands
        if c.get("figures")
    ]
    on = {p.key for p in front(points)}
    names = {c["index"]: c["name"] for c in cands}
    for c in cands:
        c["pareto"] = c["index"] in on
    return [names[p.key] for p in front(points)]


def warnings_for(ranked: list[dict[str, Any]], repeats: int, margin: float) -> list[str]:
    """What the reader must know before trusting the ranking."""
    out: list[str] = []
    if repeats < 2:
        out.append(
            "one run per candidate at the last rung: no spread was measured; --repeats 3 "
            "tells a real difference from noise"
        )
    ok = [c for c in ranked if c["slo_met"]]
    small = [c for c in ranked if c["small_sample"]]
    if small:
        f = small[0]["figures"]
        out.append(
            f"small sample: {', '.join(c['name'] for c in small)}: figures from fewer than "
            f"{MIN_RATIO_REQUESTS} requests or {MIN_RATIO_DURATION_S:.0f} s per run (e.g. "
            f"{f['completed'] // max(1, f['repeats'])} requests over "
            f"{f['duration_s'] or 0:.1f} s): "
            "differences between them may be noise; raise --num-prompts"
        )
    if len(ok) >= 2 and ok[0]["rung"] == ok[1]["rung"]:
        a, b = ok[0], ok[1]
        sa, sb = a["score"] or 0.0, b["score"] or 0.0
        gap = (sa - sb) / sa if sa else 0.0
        noise = max(
            margin,
            a["figures"]["spread"]["goodput"] or 0.0,
            b["figures"]["spread"]["goodput"] or 0.0,
            a["figures"]["spread"]["output_throughput"] or 0.0,
            b["figures"]["spread"]["output_throughput"] or 0.0,
        )
        if gap <= noise:
            out.append(
                f"{a['name']} and {b['name']} differ by {gap:.1%}, inside the noise "
                f"({noise:.1%}: the repeats' spread or the {margin:.0%} margin): treat them as "
                "equal"
            )
    cut_early = [c for c in ranked if c["status"] == "cut" and c["rung"] == 0]
    if cut_early:
        out.append(
            f"{len(cut_early)} candidate(s) were cut after the first rung only; their figures "
            "come from its few prompts"
        )
    return out


def build_document(
    *,
    header: dict[str, Any],
    candidates: Sequence[Candidate],
    steps: Sequence[Step],
    result: SearchResult | None,
    slo: Slo | None,
    rungs: Sequence[int],
    repeats: int,
    margin: float,
) -> dict[str, Any]:
    """The tune's document (see the module doc); `header` brings the run's facts."""
    by: dict[int, list[Step]] = {}
    for s in steps:
        by.setdefault(s.candidate, []).append(s)
    last = len(rungs) - 1
    cands = [candidate_summary(c, by.get(c.index, []), result, slo, last) for c in candidates]
    ranked = rank(cands)
    front_names = mark_front(cands)
    best = next((c for c in ranked if c["slo_met"]), None)
    doc = {
        "schema": SCHEMA,
        **header,
        "slo": slo.to_json() if slo else None,
        "objective": "goodput under the SLO (requests/s)" if slo else "output tokens/s",
        "candidates": cands,
        "ranking": [c["name"] for c in ranked],
        "pareto": {
            "x": "output tokens/s",
            "y": (slo.terms[0].text.split("<")[0] + " ms") if slo else "ttft_p99 ms",
            "front": front_names,
        },
        "best": None
        if best is None
        else {"name": best["name"], "index": best["index"], "words": best["words"]},
        "warnings": warnings_for(ranked, repeats, margin),
    }
    return doc


# -- text ----------------------------------------------------------------------------------


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def _ms(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f}s" if v >= 1000 else f"{v:.0f}ms"


def _pair(a: Any, b: Any) -> str:
    return "-" if a is None else f"{_num(a, '{:.0f}')}/{_num(b, '{:.0f}')}"


def _spread_text(c: dict[str, Any], key: str) -> str:
    f = c.get("figures") or {}
    s = (f.get("spread") or {}).get(key)
    if f.get("repeats", 0) < 2:
        return "-"
    return f"±{s / 2:.0%}" if s is not None else "-"


COLUMNS = (
    "rank",
    "candidate",
    "status",
    "rung",
    "goodput r/s",
    "out tok/s",
    "spread",
    "TTFT p50/p99 ms",
    "TPOT p50/p99 ms",
    "tok/J",
    "front",
)
GOODPUT = COLUMNS.index("goodput r/s")


def columns(doc: dict[str, Any]) -> tuple[str, ...]:
    """The table's columns: goodput (requests/s within the SLO) only when there is an SLO."""
    return COLUMNS if doc.get("slo") else COLUMNS[:GOODPUT] + COLUMNS[GOODPUT + 1 :]


def best_words(doc: dict[str, Any]) -> str:
    """How the best candidate was chosen, in words."""
    if doc.get("slo"):
        return "best under the SLO"
    return "best (most output tokens/s, every request answered; no SLO)"


def table_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    ordered = sorted(doc["candidates"], key=lambda c: (c.get("rank") or 10**6, c["index"]))
    rows: list[tuple[str, ...]] = []
    slo = bool(doc.get("slo"))
    for c in ordered:
        f = c.get("figures") or {}
        rung = "-" if c.get("rung") is None else f"{c['rung'] + 1} ({c.get('prompts')}p)"
        rows.append(
            (
                str(c.get("rank") or "-"),
                c["name"],
                c["status"],
                rung,
                *((_num(f.get("goodput"), "{:.2f}"),) if slo else ()),
                _num(f.get("output_throughput")),
                _spread_text(c, "output_throughput"),
                _pair(f.get("ttft_p50_ms"), f.get("ttft_p99_ms")),
                _pair(f.get("tpot_p50_ms"), f.get("tpot_p99_ms")),
                _num(f.get("tokens_per_joule"), "{:.2f}"),
                "*" if c.get("pareto") else "",
            )
        )
    return rows


def render_table(doc: dict[str, Any]) -> str:
    """The ranked table, what each candidate varies, the reasons and the warnings."""
    head = columns(doc)
    rows = [head, *table_rows(doc)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]  # fmt: skip
    lines.append("")
    for c in sorted(doc["candidates"], key=lambda c: c["index"]):
        why = f": {c['reason']}" if c.get("reason") else ""
        lines.append(f"  {c['name']}: {c['words']}{why}")
    best = doc.get("best")
    lines.append("")
    if best:
        lines.append(f"{best_words(doc)}: {best['name']} ({best['words']})")
    else:
        lines.append("no candidate met the SLO" if doc.get("slo") else "no candidate ran cleanly")
    for w in doc.get("warnings", ()):
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"


def render_markdown(doc: dict[str, Any]) -> str:
    wl = doc.get("workload") or {}
    search = doc.get("search") or {}
    lines = [
        f"# vsup tune: {doc.get('base_layout', {}).get('name')}",
        "",
        f"- SLO: `{(doc.get('slo') or {}).get('text') or 'none'}`; objective: {doc['objective']}",
        f"- workload: {wl.get('num_prompts')} prompts, input {wl.get('input_len')}, output "
        f"{wl.get('output_len')}, rate {wl.get('request_rate')}, dataset {wl.get('dataset')}, "
        f"seed {wl.get('seed')}, warm-ups {wl.get('warmups')}",
        f"- search: {search.get('method')}, eta {search.get('eta')}, rungs "
        f"{search.get('rungs')} prompts, repeats {search.get('repeats')}, "
        f"budget {search.get('budget_s') or 'none'} s, elapsed {search.get('elapsed_s')} s",
        f"- vsup {doc.get('vsup_version')}, vLLM {doc.get('vllm_version')}, started "
        f"{doc.get('started_at')}" + (" (interrupted)" if doc.get("interrupted") else ""),
        "",
        "| " + " | ".join(columns(doc)) + " |",
        "|" + "---|" * len(columns(doc)),
    ]
    for r in table_rows(doc):
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in r) + " |")
    lines += ["", "## Candidates", ""]
    for c in sorted(doc["candidates"], key=lambda c: c["index"]):
        why = f" - {c['reason']}" if c.get("reason") else ""
        lines.append(f"- **{c['name']}**: {c['words']}{why}")
    lines += ["", f"Pareto front ({doc['pareto']['x']} vs {doc['pareto']['y']}): "
              + (", ".join(doc["pareto"]["front"]) or "none"), ""]  # fmt: skip
    best = doc.get("best")
    words = best_words(doc)
    lines.append(f"**{words[0].upper()}{words[1:]}:** {best['name']} ({best['words']})" if best
                 else "**No candidate met the SLO.**" if doc.get("slo")
                 else "**No candidate ran cleanly.**")  # fmt: skip
    if doc.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in doc["warnings"]]
    chosen = next((c for c in doc["candidates"] if best and c["index"] == best["index"]), None)
    if chosen and chosen.get("clients"):
        lines += ["", "## The best candidate's clients", ""]
        for cl in chosen["clients"]:
            lines += [f"- {cl['instance']} (seed {cl['seed']}):", "", "```", str(cl["command"]),
                      "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def dump_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, default=str) + "\n"


# -- plots ---------------------------------------------------------------------------------


def _points(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for c in doc["candidates"]
        if c.get("figures")
        and c["figures"].get("output_throughput") is not None
        and c.get("latency_ms") is not None
    ]


def _mark(rank: int) -> str:
    """A candidate's one-character mark in the terminal plot: its rank in the table (1-9, then
    a = 10, b = 11, ...)."""
    return "123456789abcdefghijklmnopqrstuvwxyz"[(rank - 1) % 35]


def _limit(doc: dict[str, Any]) -> float | None:
    slo = doc.get("slo")
    return slo["terms"][0]["limit_ms"] if slo else None


def render_terminal_plot(doc: dict[str, Any], width: int = 56, height: int = 14) -> str:
    """Throughput (x) against latency (y) in characters: each candidate its mark, the SLO's
    limit a row of dashes; the legend names the marks and stars the front."""
    pts = _points(doc)
    if not pts:
        return "(no candidate has figures to plot)\n"
    xs = [c["figures"]["output_throughput"] for c in pts]
    ys = [c["latency_ms"] for c in pts]
    limit = _limit(doc)
    x0, x1 = _span(xs)
    y0, y1 = _span(ys + ([limit] if limit is not None else []))
    grid = [[" "] * width for _ in range(height)]

    def cell(x: float, y: float) -> tuple[int, int]:
        col = round((x - x0) / (x1 - x0) * (width - 1))
        row = height - 1 - round((y - y0) / (y1 - y0) * (height - 1))
        return row, col

    if limit is not None:
        row, _ = cell(x0, limit)
        grid[row] = ["-"] * width
    for c, x, y in zip(pts, xs, ys, strict=True):
        row, col = cell(x, y)
        grid[row][col] = _mark(c["rank"])
    ylab = doc["pareto"]["y"]
    out = [f"{ylab} (lower is better)" + (f"; --- SLO limit {_ms(limit)}" if limit else "")]
    for i, line in enumerate(grid):
        tick = _num(y1, "{:.0f}") if i == 0 else (_num(y0, "{:.0f}") if i == height - 1 else "")
        out.append(f"{tick:>8} |" + "".join(line))
    out.append(" " * 9 + "+" + "-" * width)
    out.append(" " * 10 + f"{x0:.1f}".ljust(width - 10) + f"{x1:.1f}")
    out.append(" " * 10 + "output tokens/s (higher is better)")
    for c in sorted(pts, key=lambda c: c["rank"]):
        star = "*" if c.get("pareto") else " "
        out.append(f"  {star} {_mark(c['rank'])} {c['name']}")
    out.append("  (marks: the rank in the table; * on the Pareto front; axes start at 0)")
    return "\n".join(out) + "\n"


def _span(values: Sequence[float]) -> tuple[float, float]:
    """An axis from 0 to a little above the largest value. From 0, not zoomed onto the
    points: two candidates 2 % apart (inside the noise of a few runs) must look 2 % apart, not
    at the two ends of the plot."""
    hi = max(max(values), 0.0)
    return 0.0, hi * 1.08 if hi > 0 else 1.0


@dataclass(frozen=True)
class _Frame:
    """The SVG plot's geometry: the image, the plot area inside it and its axes' spans."""

    x0: float = 0.0
    x1: float = 1.0
    y0: float = 0.0
    y1: float = 1.0
    w: int = 720
    h: int = 460
    left: int = 80
    right: int = 200
    top: int = 40
    bottom: int = 60

    @property
    def pw(self) -> int:
        return self.w - self.left - self.right

    @property
    def ph(self) -> int:
        return self.h - self.top - self.bottom

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.pw

    def py(self, y: float) -> float:
        return self.top + self.ph - (y - self.y0) / (self.y1 - self.y0) * self.ph


def render_svg(doc: dict[str, Any]) -> str:
    """The same plot as an SVG image (no plotting library needed)."""
    pts = _points(doc)
    f = _Frame()  # the size alone, until the points give the axes
    title = f"vsup tune: {doc.get('base_layout', {}).get('name')}"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{f.w}" height="{f.h}" '
        f'viewBox="0 0 {f.w} {f.h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{f.w}" height="{f.h}" fill="white"/>',
        f'<text x="{f.left}" y="24" font-size="15">{_esc(title)}</text>',
    ]
    if not pts:
        parts.append(f'<text x="{f.left}" y="{f.top + 40}">no candidate has figures to plot</text>')
        return "\n".join([*parts, "</svg>"]) + "\n"
    xs = [c["figures"]["output_throughput"] for c in pts]
    ys = [c["latency_ms"] for c in pts]
    limit = _limit(doc)
    f = _Frame(*_span(xs), *_span(ys + ([limit] if limit is not None else [])))
    parts += _svg_axes(f, doc["pareto"]["y"])
    if limit is not None:
        parts += _svg_limit(f, limit)
    parts += _svg_points(f, doc, pts, xs, ys)
    parts += _svg_legend(f, pts)
    return "\n".join([*parts, "</svg>"]) + "\n"


def _svg_axes(f: _Frame, y_name: str) -> list[str]:
    """The plot's box, six ticks on each axis and the axes' names."""
    parts = [
        f'<rect x="{f.left}" y="{f.top}" width="{f.pw}" height="{f.ph}" fill="none" stroke="#444"/>'
    ]
    for i in range(6):
        xv, yv = f.x0 + (f.x1 - f.x0) * i / 5, f.y0 + (f.y1 - f.y0) * i / 5
        parts.append(
            f'<text x="{f.px(xv):.1f}" y="{f.top + f.ph + 18}" text-anchor="middle">{xv:.1f}</text>'
        )
        parts.append(
            f'<text x="{f.left - 6}" y="{f.py(yv) + 4:.1f}" text-anchor="end">{yv:.0f}</text>'
        )
    parts.append(
        f'<text x="{f.left + f.pw / 2}" y="{f.h - 15}" text-anchor="middle">output tokens/s '
        "(higher is better)</text>"
    )
    parts.append(
        f'<text x="18" y="{f.top + f.ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {f.top + f.ph / 2})">{_esc(y_name)} (lower is better)'
        "</text>"
    )
    return parts


def _svg_limit(f: _Frame, limit: float) -> list[str]:
    """The SLO's latency limit: a dashed red line, named."""
    return [
        f'<line x1="{f.left}" x2="{f.left + f.pw}" y1="{f.py(limit):.1f}" '
        f'y2="{f.py(limit):.1f}" stroke="#c33" stroke-dasharray="6 4"/>',
        f'<text x="{f.left + f.pw - 4}" y="{f.py(limit) - 5:.1f}" text-anchor="end" '
        f'fill="#c33">SLO {_esc(_ms(limit))}</text>',
    ]


def _svg_points(
    f: _Frame, doc: dict[str, Any], pts: list[dict[str, Any]], xs: list[float], ys: list[float]
) -> list[str]:
    """The Pareto front as a line, and each candidate as a dot with its rank."""
    parts = []
    on = sorted(
        (c for c in pts if c.get("pareto")), key=lambda c: c["figures"]["output_throughput"]
    )
    if len(on) > 1:
        path = " ".join(
            f"{f.px(c['figures']['output_throughput']):.1f},{f.py(c['latency_ms']):.1f}" for c in on
        )
        parts.append(f'<polyline points="{path}" fill="none" stroke="#36c" stroke-width="1.5"/>')
    best = (doc.get("best") or {}).get("index")
    for c, x, y in zip(pts, xs, ys, strict=True):
        colour = "#2a2" if c["index"] == best else ("#36c" if c.get("pareto") else "#999")
        parts.append(f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="5" fill="{colour}"/>')
        parts.append(f'<text x="{f.px(x) + 7:.1f}" y="{f.py(y) - 6:.1f}">{c["rank"]}</text>')
    return parts


def _svg_legend(f: _Frame, pts: list[dict[str, Any]]) -> list[str]:
    """Rank -> name at the right, and what the marks mean."""
    parts = []
    for n, c in enumerate(sorted(pts, key=lambda c: c["rank"])):
        star = " *" if c.get("pareto") else ""
        parts.append(
            f'<text x="{f.w - f.right + 12}" y="{f.top + 14 + 16 * n}">{c["rank"]} '
            f"{_esc(c['name'])}{star}</text>"
        )
    parts.append(
        f'<text x="{f.w - f.right + 12}" y="{f.top + 30 + 16 * len(pts)}" fill="#666">rank; '
        "* Pareto front; green: best</text>"
    )
    return parts


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def has_matplotlib() -> bool:
    try:
        import matplotlib  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def write_png(doc: dict[str, Any], path: str) -> None:
    """The plot as PNG through matplotlib (only where it is installed: `has_matplotlib`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found]

    pts = _points(doc)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for c in pts:
        colour = "tab:green" if c["index"] == (doc.get("best") or {}).get("index") else (
            "tab:blue" if c.get("pareto") else "tab:gray")  # fmt: skip
        ax.scatter(c["figures"]["output_throughput"], c["latency_ms"], color=colour)
        label = f"{c['rank']} {c['name']}"
        ax.annotate(label, (c["figures"]["output_throughput"], c["latency_ms"]), fontsize=7)
    on = sorted(
        (c for c in pts if c.get("pareto")), key=lambda c: c["figures"]["output_throughput"]
    )
    if len(on) > 1:
        ax.plot([c["figures"]["output_throughput"] for c in on], [c["latency_ms"] for c in on])
    if _limit(doc) is not None:
        ax.axhline(_limit(doc), color="tab:red", linestyle="--", label="SLO")
    ax.set_xlim(left=0)  # from 0: a gap inside the noise must not fill the plot (_span)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel(doc["pareto"]["y"])
    ax.set_title(f"vsup tune: {doc.get('base_layout', {}).get('name')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the chosen layout ---------------------------------------------------------------------


def best_layout_text(doc: dict[str, Any], candidate_toml: str, out_name: str) -> str:
    """The best candidate's layout with a comment block saying how it was chosen."""
    best = doc["best"]
    chosen = next(c for c in doc["candidates"] if c["index"] == best["index"])
    f = chosen["figures"]
    search = doc["search"]
    wl = doc["workload"]
    ran = [c for c in doc["candidates"] if c.get("figures")]
    pruned = sum(1 for c in doc["candidates"] if c["status"] == "pruned")
    lines = [
        f"# Chosen by `vsup tune` at {doc.get('ended_at')} on {doc.get('host')} "
        f"(vsup {doc.get('vsup_version')}, vLLM {doc.get('vllm_version')}).",
        f"# Base layout: {doc['base_layout']['path']}",
        f"# SLO: {(doc.get('slo') or {}).get('text') or 'none'}; objective: {doc['objective']}.",
        f"# Workload: {wl.get('num_prompts')} prompts, input {wl.get('input_len')}, output "
        f"{wl.get('output_len')}, request rate {wl.get('request_rate')}, dataset "
        f"{wl.get('dataset')}, seed {wl.get('seed')}.",
        f"# Search: {search['method']} (eta {search['eta']}, rungs {search['rungs']} prompts, "
        f"{search['repeats']} repeat(s) at the last); {len(doc['candidates'])} candidates, "
        f"{pruned} pruned before starting, {len(ran)} measured.",
        f"# This one ({best['words']}): "
        + (f"goodput {_num(f['goodput'], '{:.2f}')} req/s, " if doc.get("slo") else "")
        + f"{_num(f['output_throughput'])} output tok/s, TTFT p99 {_ms(f['ttft_p99_ms'])}, "
        f"TPOT p99 {_ms(f['tpot_p99_ms'])}, over {f['repeats']} run(s) of "
        f"{chosen.get('prompts')} prompts; rank 1 of {len(doc['ranking'])}.",
    ]
    if len(doc["ranking"]) > 1:
        lines.append(f"# Runner-up: {doc['ranking'][1]}.")
    for w in doc.get("warnings", ()):
        lines.append(f"# Warning: {w}")
    lines += [
        "# Validated on this node; not applied. Apply it with "
        f"`vsup up {out_name}` (or run the tune with --apply).",
        "",
    ]
    return "\n".join(lines) + candidate_toml
