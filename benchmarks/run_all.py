"""Run every benchmark, take medians, publish the table (`make bench`).

    python -m benchmarks.run_all [--quick] [--docs] [--only NAME ...]

Each benchmark is a separate process printing its figures as key=value on its last line. Those
that give one figure per run are run 5 times and the median of each key is taken; those that
repeat internally (windows, kills, starts) run once and report their own medians (the table's
"runs" column says which). Writes the Markdown table to stdout, `.bench/results.md` (with every
run's last line) and, on a full run (or with --docs), `docs/benchmarks.md`.

--quick skips the slow parts: the real vLLM stop (the emulator's is kept), the naive
comparisons, and repeats (1 run each, shorter windows). Its table is for a look, not for
publishing: it does not touch docs/benchmarks.md unless --docs is given.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import at_exit, parse_last_line  # noqa: E402

TIMEOUT_S = 1200  # one benchmark process, at most


@dataclass
class Bench:
    name: str
    args: list[str]
    runs: int  # process runs whose last lines are combined by median
    quick_args: list[str] | None = None  # replaces args under --quick (1 run then)
    needs: str | None = None  # a file that must exist (the TUI benchmarks come with the TUI)
    results: list[dict[str, str]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    error: str | None = None

    def command(self, quick: bool) -> str:
        args = self.quick_args if quick and self.quick_args is not None else self.args
        return shlex.join(["python", "-m", f"benchmarks.{self.name}", *args])

    def median(self, key: str) -> float | None:
        values = [float(r[key]) for r in self.results if key in r]
        return statistics.median(values) if values else None


def benches() -> list[Bench]:
    return [
        Bench("metrics_parse", [], 5, quick_args=["--iterations", "500"]),
        Bench(
            "overhead",
            ["--instances", "8", "--seconds", "10", "--runs", "5"],
            1,
            quick_args=["--instances", "8", "--seconds", "5", "--runs", "1", "--no-naive"],
        ),
        Bench(
            "overhead",
            ["--instances", "64", "--seconds", "10", "--runs", "5"],
            1,
            quick_args=["--instances", "64", "--seconds", "5", "--runs", "1", "--no-naive"],
        ),
        Bench(
            "crash_detect",
            ["--kills", "50", "--naive-kills", "20"],
            5,
            quick_args=["--kills", "50", "--naive-kills", "0"],
        ),
        Bench(
            "stop_release",
            ["--runs", "5", "--vllm-runs", "3", "--grace", "2"],
            1,
            quick_args=["--runs", "2", "--no-vllm", "--grace", "2"],
        ),
        Bench(
            "launch",
            ["--runs", "5", "--startup-s", "2"],
            1,
            quick_args=["--runs", "1", "--startup-s", "2", "--no-sequential"],
        ),
        Bench("pull_replicas", ["--runs", "3"], 1, quick_args=["--runs", "1"]),
        Bench("tui_render", [], 5, quick_args=[], needs="benchmarks/tui_render.py"),
        Bench(
            "tui_idle",
            ["--seconds", "15"],
            5,
            quick_args=["--seconds", "5"],
            needs="benchmarks/tui_idle.py",
        ),
        Bench(
            "fleet_status",
            ["--nodes", "16", "--rounds", "20", "--cold-rounds", "5"],
            1,
            quick_args=[
                "--nodes",
                "4",
                "--rounds",
                "5",
                "--cold-rounds",
                "2",
                "--dashboard-s",
                "10",
            ],
            needs="benchmarks/fleet_status.py",
        ),
    ]


def run_bench(b: Bench, quick: bool) -> None:
    if b.needs and not (ROOT / b.needs).exists():
        b.error = f"{b.needs} is not in this checkout"
        return
    args = b.quick_args if quick and b.quick_args is not None else b.args
    runs = 1 if quick else b.runs
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    for i in range(runs):
        t0 = time.monotonic()
        print(f"== {b.command(quick)}  (run {i + 1}/{runs})", flush=True)
        child = subprocess.Popen(
            [sys.executable, "-m", f"benchmarks.{b.name}", *args],
            cwd=str(ROOT),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Killed mid-run, run_all passes SIGTERM on: the benchmark then cleans up after itself.
        at_exit(lambda c=child: c.poll() is None and (c.terminate(), c.wait(90)))
        try:
            stdout, stderr = child.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.terminate()
            child.communicate(timeout=90)
            b.error = f"timed out after {TIMEOUT_S} s"
            return
        proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
        out = proc.stdout.strip()
        last = out.splitlines()[-1] if out else ""
        print(f"   {last}  ({time.monotonic() - t0:.0f} s)", flush=True)
        if proc.returncode != 0:
            b.error = f"exit {proc.returncode}: {(proc.stderr or out).strip()[-600:]}"
            print(f"   FAILED: {b.error}", flush=True)
            return
        b.outputs.append(last)
        b.results.append(parse_last_line(out))


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else (" (met)" if ok else " (**missed**)")


def table(by: dict[str, Bench], quick: bool) -> list[str]:
    """The published rows: figure | target | measured | runs | command."""
    rows = []

    def cmd(key: str) -> str:
        return f"`{by[key].command(quick)}`"

    def add(key: str, figure: str, target: str, measured: str, runs: str) -> None:
        b = by[key]
        if b.error or not b.results:
            measured = f"not measured ({b.error or 'no result'})"
        rows.append(f"| {figure} | {target} | {measured} | {runs} | {cmd(key)} |")

    mp = by["metrics_parse"]
    parse, base = mp.median("parse_ms"), mp.median("baseline_ms")
    add(
        "metrics_parse",
        "/metrics read, one ~60 KB vLLM payload",
        "<= 0.3 ms",
        f"{fmt(parse, ' ms', 3)}{verdict(parse is not None and parse <= 0.3)}; full "
        f"prometheus_client parse {fmt(base, ' ms', 2)} (x{fmt(mp.median('ratio'), '', 0)})",
        f"{_n(len(mp.results), 'run')} (each: median of {'500' if quick else '2000'} parses)",
    )
    for key, n, target in (("overhead_8", 8, 2.0), ("overhead_64", 64, 10.0)):
        b = by[key]
        d = b.median("daemon_cpu_pct")
        naive = b.median("naive_cpu_pct")
        extra = (
            f"; naive poller {fmt(naive, ' %')} (x{fmt(b.median('naive_ratio'), '', 0)})"
            if naive is not None
            else ""
        )
        add(
            key,
            f"daemon CPU watching {n} emulated vLLM servers at 1 Hz",
            f"<= {target:g} % of a core",
            f"{fmt(d, ' %', 1)}{verdict(d is not None and d <= target)}; "
            f"{fmt(b.median('per_instance_poll_ms'), ' ms', 2)} per instance per poll, "
            f"RSS {fmt(b.median('daemon_rss_mb'), ' MB', 0)}{extra}",
            "5 windows of 10 s" if not quick else "1 window of 5 s",
        )
    cd = by["crash_detect"]
    p99 = cd.median("detect_ms_p99")
    naive = cd.median("naive_ms_p50")
    extra = f"; 1 Hz poller p50 {fmt(naive, ' ms', 0)}" if naive is not None else ""
    add(
        "crash_detect",
        "crash detection: SIGKILL -> state change, p99",
        "<= 100 ms",
        f"{fmt(p99, ' ms', 1)}{verdict(p99 is not None and p99 <= 100)} "
        f"(p50 {fmt(cd.median('detect_ms_p50'), ' ms', 1)}){extra}",
        f"{_n(len(cd.results), 'run')} of 50 kills",
    )
    st = by["stop_release"]
    if st.median("vllm_stop_ms") is not None:
        add(
            "stop_release",
            "stop a real CPU vLLM (API server, EngineCore, worker) until no process of it is left",
            "-",
            f"{fmt(st.median('vllm_stop_ms'), ' ms', 0)} (last process gone after "
            f"{fmt(st.median('vllm_gone_ms'), ' ms', 0)})",
            f"{st.results[0].get('vllm_runs', '?')} vLLM starts and stops",
        )
    grace = st.median("grace_s")
    its = st.median("ignore_term_stop_ms")
    ok = its is not None and grace is not None and its <= grace * 1e3 + 1000
    add(
        "stop_release",
        "stop a child that ignores SIGTERM (SIGKILL after the grace period)",
        "<= grace + 1 s",
        f"{fmt(its / 1e3 if its else None, ' s', 3)} with grace {fmt(grace, ' s', 0)}"
        f"{verdict(ok if its is not None else None)}; a SIGTERM-honouring emulator: "
        f"{fmt(st.median('emulator_stop_ms'), ' ms', 0)}",
        _n(st.results[0].get("runs", "?") if st.results else "?", "run"),
    )
    la = by["launch"]
    single = la.median("single_s")
    par = la.median("parallel_8_s")
    seq = la.median("sequential_8_s")
    ratio = la.median("parallel_ratio")
    extra = (
        f"; sequential start {fmt(seq, ' s', 1)} (x{fmt(la.median('speedup'), '', 1)} slower)"
        if seq is not None
        else ""
    )
    add(
        "launch",
        "8 instances on 8 devices, start-up 2 s each: spawn to all ready",
        "~ one start",
        f"{fmt(par, ' s', 2)} vs {fmt(single, ' s', 2)} for one (x{fmt(ratio, '', 2)}){extra}",
        _n(la.results[0].get("runs", "?") if la.results else "?", "run"),
    )
    add(
        "launch",
        "4 co-tenants of one device, start-up 2 s each",
        "one after another",
        f"{fmt(la.median('cotenant_4_s'), ' s', 2)} (x{fmt(la.median('cotenant_ratio'), '', 2)}"
        " one start)",
        _n(la.results[0].get("runs", "?") if la.results else "?", "run"),
    )
    pr = by["pull_replicas"]
    if not pr.error or pr.results:

        def mode(m: str) -> str:
            return (
                f"{fmt(pr.median(f'{m}_mib'), ' MiB', 0)} in {fmt(pr.median(f'{m}_gets'), '', 0)}"
                f" GETs and {fmt(pr.median(f'{m}_api'), '', 0)} API calls, all ready "
                f"{fmt(pr.median(f'{m}_all_ready_s'), ' s', 1)}, longest start "
                f"{fmt(pr.median(f'{m}_startup_max_s'), ' s', 2)}"
            )

        add(
            "pull_replicas",
            "8 replicas of one 128 MiB hub model (fake hub, 64 MiB/s per transfer): "
            "`vsup up` with the pull step vs `--no-pull` (the replicas fetch it themselves)",
            "each file once; no download inside a start",
            f"pull: {mode('pull')} (the pull {fmt(pr.median('pull_pull_s'), ' s', 1)}); "
            f"without: {mode('no_pull')}",
            (pr.results[0].get("runs", "3") if pr.results else "?") + " runs each",
        )
    tr = by["tui_render"]
    if not tr.error or tr.results:
        v = tr.median("refresh_ms_median")
        add(
            "tui_render",
            "dashboard refresh with 64 instances (CPU of the UI thread per snapshot)",
            "<= 20 ms",
            f"{fmt(v, ' ms', 2)}{verdict(v is not None and v <= 20)}",
            _n(len(tr.results), "run"),
        )
    ti = by["tui_idle"]
    if not ti.error or ti.results:
        v = ti.median("cpu_pct")
        add(
            "tui_idle",
            "dashboard idle, 8 instances, 1 s refresh (CPU of its process)",
            "<= 3 % of a core",
            f"{fmt(v, ' %', 2)}{verdict(v is not None and v <= 3)}",
            _n(len(ti.results), "run") + " of 15 s",
        )
    fs = by["fleet_status"]
    if not fs.error or fs.results:
        warm = fs.median("warm_median_ms")
        add(
            "fleet_status",
            "`vsup fleet status` of 16 nodes (sshd each, on 127.0.0.1), warm: the whole command",
            "well under 1 s",
            f"median {fmt(warm, ' ms', 0)}, p99 {fmt(fs.median('warm_p99_ms'), ' ms', 0)}; "
            f"CPU {fmt(fs.median('warm_cpu_ms'), ' ms', 0)}; the query alone "
            f"{fmt(fs.median('inprocess_median_ms'), ' ms', 1)} (load avg {fmt(fs.median('load'))})"
            + verdict(warm is not None and warm < 1000),
            "20 runs",
        )
        add(
            "fleet_status",
            "`vsup fleet status` of 16 nodes, cold (16 SSH connections first)",
            "-",
            f"median {fmt(fs.median('cold_median_ms'), ' ms', 0)}, p99 "
            f"{fmt(fs.median('cold_p99_ms'), ' ms', 0)} (the 16 nodes' sshd and vsup on the "
            "same 2 cores)",
            "5 runs",
        )
        add(
            "fleet_status",
            "fleet dashboard, 16 nodes polled every 2 s (CPU of its process)",
            "-",
            f"{fmt(fs.median('dashboard_cpu_pct'), ' %', 1)} of a core",
            "1 run of 30 s",
        )
    return rows


def _n(count: object, noun: str) -> str:
    return f"{count} {noun}" + ("" if str(count) == "1" else "s")


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, "
        f"Linux {platform.release()}"
    )


def render(by: dict[str, Bench], quick: bool) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    head = [
        "## Benchmarks: what vsup itself costs and how fast it reacts",
        "",
        f"Measured {now} on {machine()}, by `make bench` (`python -m benchmarks.run_all"
        f"{' --quick' if quick else ''}`). Medians; the runs column says of what. Emulated "
        "servers are `tests/programs/vllm_emulator.py` (a payload recorded from the real CPU "
        "vLLM 0.32 with moving values), not vLLM; the real-vLLM row runs the real CPU vLLM.",
        "",
        "| figure | target | measured | runs | reproduce |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(head + table(by, quick)) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the real vLLM, fewer runs")
    ap.add_argument("--docs", action="store_true", help="write docs/benchmarks.md even if quick")
    ap.add_argument("--only", nargs="*", help="benchmark names to run (others: not measured)")
    args = ap.parse_args(argv)
    all_benches = benches()
    by = {}
    for b in all_benches:
        key = b.name
        if b.name == "overhead":
            key = f"overhead_{b.args[1]}"
        by[key] = b
    for b in all_benches:
        if args.only and b.name not in args.only:
            b.error = "not run (--only)"
            continue
        run_bench(b, args.quick)
    text = render(by, args.quick)
    notes = Path(__file__).with_name("NOTES.md")
    if notes.exists():
        text += "\n" + notes.read_text()
    print()
    print(text)
    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    raw = ["", "### Last lines of every run", ""]
    for key, b in by.items():
        raw.append(f"- {key}: " + (" / ".join(f"`{o}`" for o in b.outputs) or f"({b.error})"))
    (out / "results.md").write_text(text + "\n".join(raw) + "\n")
    print(f"wrote {out / 'results.md'}")
    if (not args.quick and not args.only) or args.docs:
        (ROOT / "docs" / "benchmarks.md").write_text(text)
        print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}")
    failed = [
        k
        for k, b in by.items()
        if b.error
        and not b.error.startswith(("not run",))
        and not (b.needs and not (ROOT / b.needs).exists())
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
