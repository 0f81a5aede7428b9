"""A bench run's output: the side-by-side table (a column per layout), markdown, JSON.

The run document (`BenchReport.to_json`) is what `--json` writes; the table and the markdown
are rendered from it, so what is printed is what is saved.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

GiB = 1024**3
SCHEMA = 1
# A throughput ratio between two runs means something only when each ran this many requests
# for this long: a handful of requests is over before the batch fills, and their ratio is
# noise (issue 25: 8 prompts gave "3.82x").
MIN_RATIO_REQUESTS = 50
MIN_RATIO_DURATION_S = 10.0
# vsup's tokens/s is a rate over this window (telemetry/rates.py TOKENS_WINDOW_S), read at
# its ~1 s polls; a run shorter than it reads low
VSUP_TOKENS_WINDOW_S = 10.0


def _f(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _pair(stats: dict[str, Any] | None, fmt: str = "{:.0f}") -> str:
    stats = stats or {}
    if stats.get("p50") is None:
        return "-"
    return f"{_f(stats.get('p50'), fmt)} / {_f(stats.get('p99'), fmt)}"


def _gpus(run: dict[str, Any]) -> str:
    gpus = sorted({g for i in run.get("instances", ()) for g in i.get("gpus") or ()})
    if not run.get("instances"):
        return "-"
    return ",".join(map(str, gpus)) if gpus else "cpu"


def _hbm(run: dict[str, Any]) -> str:
    t = run.get("totals") or {}
    if t.get("hbm_peak_bytes") is not None:
        return f"{t['hbm_peak_bytes'] / GiB:.1f}G"
    return "n/a" if any(i.get("gpus") for i in run.get("instances", ())) else "-"


def _ratio(run: dict[str, Any]) -> str:
    r = run.get("ratio_to_first")
    if r is None:
        return "-"
    return f"{r:.2f}x" + ("*" if run.get("ratio_small_sample") else "")


def small_sample(run: dict[str, Any]) -> bool:
    """Too few requests, or too short a run, for its throughput to be compared."""
    t = run.get("totals") or {}
    return (t.get("completed") or 0) < MIN_RATIO_REQUESTS or (
        t.get("duration_s") or 0.0
    ) < MIN_RATIO_DURATION_S


def _kv(run: dict[str, Any]) -> str:
    return _f((run.get("totals") or {}).get("kv_peak"), "{:.0%}")


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("outcome", lambda r: r.get("outcome", "-")),
    ("instances", lambda r: str(len(r.get("instances", ()))) if r.get("instances") else "-"),
    ("GPUs", _gpus),
    (
        "requests ok / failed",
        lambda r: (
            "-" if not r.get("totals") else f"{r['totals']['completed']} / {r['totals']['failed']}"
        ),
    ),
    ("requests/s", lambda r: _f((r.get("totals") or {}).get("request_throughput"), "{:.2f}")),
    (
        "output tok/s (client)",
        lambda r: _f((r.get("totals") or {}).get("output_throughput"), "{:.1f}"),
    ),
    ("ratio to first", _ratio),
    ("TTFT p50 / p99 ms", lambda r: _pair((r.get("totals") or {}).get("ttft_ms"))),
    ("TPOT p50 / p99 ms", lambda r: _pair((r.get("totals") or {}).get("tpot_ms"), "{:.1f}")),
    ("preemptions", lambda r: _f((r.get("totals") or {}).get("preemptions"), "{:.0f}")),
    ("KV peak", _kv),
    ("HBM peak", _hbm),
    (
        "vsup tok/s (10 s avg)",
        lambda r: _f((r.get("totals") or {}).get("tokens_per_s_vsup"), "{:.1f}"),
    ),
)


def column_title(run: dict[str, Any]) -> str:
    return (run.get("layout") or {}).get("name") or "?"


def table_rows(runs: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Header row (layout names) then one row per figure."""
    out = [["", *(column_title(r) for r in runs)]]
    for label, cell in ROWS:
        out.append([label, *(cell(r) for r in runs)])
    return out


def render_table(runs: Sequence[dict[str, Any]]) -> str:
    """The terminal table: a column per layout, problems listed below it."""
    rows = table_rows(runs)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += problem_lines(runs) + notes(runs)
    return "\n".join(lines) + "\n"


def problem_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    return [f"{column_title(r)}: {p}" for r in runs for p in r.get("problems", ())]


def notes(runs: Sequence[dict[str, Any]]) -> list[str]:
    """What the figures can and cannot say: a ratio from too small a sample, and what each
    tokens/s measures when a run is too short for vsup's figure to agree with the client's."""
    out = []
    small = [r for r in runs if r.get("ratio_small_sample")]
    if small:
        sizes = ", ".join(
            f"{column_title(r)} {(r.get('totals') or {}).get('completed') or 0} requests in "
            f"{(r.get('totals') or {}).get('duration_s') or 0:.1f} s"
            for r in small
        )
        out.append(
            f"* too small a sample for the ratio to mean anything ({sizes}): compare runs of at "
            f"least {MIN_RATIO_REQUESTS} requests and {MIN_RATIO_DURATION_S:g} s each "
            "(--num-prompts, --request-rate)"
        )
    short = [
        r
        for r in runs
        if (r.get("totals") or {}).get("tokens_per_s_vsup") is not None
        and ((r.get("totals") or {}).get("duration_s") or 0.0) < VSUP_TOKENS_WINDOW_S
    ]
    if short:
        out.append(
            "output tok/s (client) is the client's output tokens over its run time; vsup tok/s "
            f"is the mean of vsup's {VSUP_TOKENS_WINDOW_S:g} s rate of generated tokens at its "
            "~1 s polls while the clients ran, so it reads low for a run shorter than "
            f"{VSUP_TOKENS_WINDOW_S:g} s ("
            + ", ".join(
                f"{column_title(r)}: {(r.get('totals') or {}).get('duration_s') or 0:.1f} s"
                for r in short
            )
            + ")"
        )
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    """The run as markdown: workload, the table, problems and the client commands."""
    runs = doc.get("runs", [])
    w = doc.get("workload", {})
    out = ["# vsup bench", ""]
    out.append(
        f"Workload: {w.get('num_prompts')} prompts, {w.get('dataset')}"
        + (f" ({w.get('dataset_path')})" if w.get("dataset_path") else "")
        + (f", {w.get('input_len')} in" if w.get("dataset") == "random" else "")
        + f" / {w.get('output_len')} out, request rate {w.get('request_rate')}, "
        f"seed {w.get('seed')}; vLLM {doc.get('vllm_version') or '?'}; "
        f"{doc.get('started_at')}."
    )
    out.append("")
    rows = table_rows(runs)
    out.append("| " + " | ".join(rows[0]) + " |")
    out.append("|" + "---|" + "---:|" * (len(rows[0]) - 1))
    for row in rows[1:]:
        out.append("| " + " | ".join(row) + " |")
    problems = problem_lines(runs)
    if problems:
        out += ["", "Problems:", ""] + [f"- {p}" for p in problems]
    if notes(runs):
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes(runs)]
    out += ["", "Client commands (`vllm bench serve` equivalents):", ""]
    for r in runs:
        for i in r.get("instances", ()):
            cmd = (i.get("client") or {}).get("equivalent")
            if cmd:
                out.append(f"- {column_title(r)} / {i['name']}: `{cmd}`")
    return "\n".join(out) + "\n"


def ratio_to_first(runs: Sequence[dict[str, Any]]) -> None:
    """Set each run's output-throughput ratio to the first run that has a figure, and
    `ratio_small_sample` when either run is too small a sample for it to mean anything."""
    base = next(
        (
            r["totals"]["output_throughput"]
            for r in runs
            if (r.get("totals") or {}).get("output_throughput")
        ),
        None,
    )
    base_run = next(
        (r for r in runs if (r.get("totals") or {}).get("output_throughput")),
        None,
    )
    for r in runs:
        v = (r.get("totals") or {}).get("output_throughput")
        r["ratio_to_first"] = v / base if base and v is not None else None
        # a ratio is only as good as the smaller of the two samples it compares
        r["ratio_small_sample"] = r["ratio_to_first"] is not None and (
            small_sample(r) or (base_run is not None and small_sample(base_run))
        )


def dump_json(doc: dict[str, Any]) -> str:
    def default(o: Any) -> Any:
        return str(o)

    return json.dumps(_finite(doc), indent=2, default=default) + "\n"


def _finite(value: Any) -> Any:
    """inf/nan are not JSON: say them as strings."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
