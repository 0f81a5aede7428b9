"""One step of a tune: a candidate at a rung, through the bench's runner (vsup/bench/runner.py).

The bench applies the candidate (a layout the daemon already runs is unchanged: no restart
between the rungs of one candidate), waits until it is ready, splits the prompts over its
instances, runs one `vllm bench serve` per instance and records vsup's telemetry. A crash (not
ready, an instance that dies, a client that fails) is the bench run's outcome and problems; the
tune records them and goes on. On top of the bench's figures a step gets:
- goodput and the SLO's verdict (slo.py), from every request of the clients' detailed results;
- energy: output tokens per joule from the candidate's GPUs' power readings during the
  measured window (whole-board power, idle draw included), or None with the reason (no GPU,
  no power reading).

Warm-up is excluded twice: each client sends its test request and `warmups` warm-up requests
(`--num-warmups`) before the measured run, and rungs after the first run on a server that
already served the first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vsup.bench import results as res
from vsup.bench.runner import BenchRunner, LayoutToRun
from vsup.bench.workload import Workload
from vsup.control.errors import ControlError
from vsup.tune.search import Step
from vsup.tune.slo import Slo, judge, request_times


@dataclass(frozen=True)
class TuneWorkload(Workload):
    """The bench's workload and the clients' warm-up requests (vLLM's `--num-warmups`)."""

    warmups: int = 0

    def client_flags(self, num_prompts: int, request_rate: float, seed: int) -> list[str]:
        flags = super().client_flags(num_prompts, request_rate, seed)
        if self.warmups:
            flags += ["--num-warmups", str(self.warmups)]
        return flags


class TuneRunner(BenchRunner):
    """The bench's runner; each run also gets its energy figures."""

    def _record(self, run: dict, records: list[dict]) -> None:
        super()._record(run, records)
        assert self._sampler is not None
        starts = [c.started_at for c in self._clients if c.started_at]
        ends = [c.ended_at for c in self._clients if c.ended_at]
        window = (min(starts), max(ends)) if starts and ends else None
        gpus = sorted({g for r in records for g in r.get("gpus") or ()})
        tokens = (run.get("totals") or {}).get("output_tokens")
        run["energy"] = energy(self._sampler.samples, gpus, window, tokens)


def energy(
    samples: Sequence[tuple[float, dict[str, Any]]],
    gpus: Sequence[int],
    window: tuple[float, float] | None,
    output_tokens: int | None,
) -> dict[str, Any]:
    """Output tokens per joule over `window` from the GPUs' power in the status samples:
    each GPU's mean draw times the window, summed. None with `why` when it cannot be known."""
    out: dict[str, Any] = {"tokens_per_joule": None, "joules": None, "mean_power_w": None}
    if not gpus:
        return {**out, "why": "CPU instances: there is no GPU power to read"}
    if window is None or window[1] <= window[0] or not output_tokens:
        return {**out, "why": "no measured window (no client ran to its end)"}
    means = []
    for idx in gpus:
        draws = [
            g.get("power_w")
            for t, doc in samples
            if window[0] <= t <= window[1]
            for g in doc.get("gpus", ())
            if g.get("index") == idx and g.get("power_w") is not None
        ]
        if not draws:
            return {**out, "why": f"GPU {idx} gave no power reading during the run"}
        means.append(sum(draws) / len(draws))
    watts = sum(means)
    joules = watts * (window[1] - window[0])
    return {
        "tokens_per_joule": output_tokens / joules if joules > 0 else None,
        "joules": joules,
        "mean_power_w": watts,
        "why": "whole-board power of the candidate's GPUs, idle draw included",
    }


def run_requests(run: dict[str, Any]) -> list[dict[str, float]]:
    """Every successful request of a bench run, from its clients' detailed result files."""
    out: list[dict[str, float]] = []
    for inst in run.get("instances", ()):
        client = inst.get("client") or {}
        if client.get("exit_code") != 0 or not client.get("result_file"):
            continue
        try:
            result = json.loads(Path(client["result_file"]).read_text())
        except (OSError, ValueError):
            continue
        out += res._requests(result)
    return out


@dataclass
class Measurer:
    """The search's `measure`: one bench run of a candidate, scored (see the module doc)."""

    runner: TuneRunner
    workload: TuneWorkload
    slo: Slo | None
    out_dir: Path
    order: list[int]  # the candidates that run, by index, in order (for [i/N])
    paths: dict[int, Path]  # candidate index -> its layout file in the out dir
    say: Callable[[str], None] = print

    def __call__(self, cand: Any, rung: int, prompts: int, repeat: int) -> Step:
        self.runner.workload = replace(self.workload, num_prompts=prompts)
        tag = f"c{cand.index:02d}-r{rung}" + (f"-x{repeat + 1}" if repeat else "")
        self.runner.out_dir = self.out_dir / tag
        lay = LayoutToRun(self.paths[cand.index], cand.name, cand.toml, specs=list(cand.specs))
        t0 = time.monotonic()
        try:
            k = self.order.index(cand.index) + 1
            run = self.runner.run_layout(k, len(self.order), lay)
        except ControlError as exc:
            # the daemon refused it (e.g. it shuts down): recorded, the search goes on
            self.runner._abort_current()
            run = self.runner.runs[-1]
            run["outcome"] = "failed"
            run["problems"].append(f"the daemon refused it: {exc.message}")
        seconds = time.monotonic() - t0
        return score_run(cand.index, rung, prompts, repeat, run, self.slo, seconds)


def score_run(
    index: int,
    rung: int,
    prompts: int,
    repeat: int,
    run: dict[str, Any],
    slo: Slo | None,
    seconds: float,
) -> Step:
    """A bench run as a search step: the SLO's verdict and the score the search ranks by
    (goodput under an SLO, else output tokens/s)."""
    totals = run.get("totals") or {}
    times = request_times(run_requests(run))
    verdict = judge(slo, times, int(totals.get("failed") or 0), totals.get("duration_s"))
    score = verdict.goodput if slo is not None else totals.get("output_throughput")
    run["slo"] = verdict.to_json()
    return Step(
        candidate=index,
        rung=rung,
        prompts=prompts,
        repeat=repeat,
        outcome=run.get("outcome", "failed"),
        score=score,
        slo_met=verdict.met,
        seconds=seconds,
        start_seconds=run.get("ready_after_s"),
        result=run,
    )
