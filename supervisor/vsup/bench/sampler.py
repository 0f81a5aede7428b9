"""vsup's own view of a run: status polls (~1 Hz) while the clients run, summarised per
instance and per GPU.

`Sampler` polls in a thread of its own (with its own control client); `summarize` is pure and
works on the recorded status documents, so it is tested on hand-made ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vsup.states import SERVING


@dataclass
class Sampler:
    """Records `status()` answers every `interval` seconds until `stop()`."""

    status: Callable[[], dict[str, Any]]
    interval: float = 1.0
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> dict[str, Any] | None:
        try:
            doc = self.status()
        except Exception:  # a daemon hiccup costs one point, never the run
            self.errors += 1
            return None
        self.samples.append((time.time(), doc))
        return doc

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 30)
            self._thread = None


def _max(values: Sequence[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _mean(values: Sequence[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def summarize(
    samples: Sequence[tuple[float, dict[str, Any]]],
    names: Sequence[str],
    window: tuple[float, float] | None = None,
) -> dict:
    """Per instance: KV peak, preemptions during the run (counter delta), tokens/s (mean and
    peak of vsup's rate), HBM peak, and whether it stopped serving or restarted (`died`); per
    GPU: HBM used peak, utilisation mean and peak. Unknown figures are None.

    `window` (wall-clock start, end of the load) limits the means to the samples taken while
    the clients ran; peaks and counters use every sample (the last one is taken after the
    end so the counters include it)."""

    def inside(t: float) -> bool:
        return window is None or window[0] <= t <= window[1]

    per = {name: _instance_summary(samples, name, inside) for name in names}
    return {"instances": per, "gpus": _gpu_summaries(samples, inside)}


def _instance_summary(
    samples: Sequence[tuple[float, dict[str, Any]]], name: str, inside: Callable[[float], bool]
) -> dict[str, Any]:
    """One instance's figures over the samples (see summarize)."""
    points = [(t, i) for t, doc in samples for i in doc.get("instances", ()) if i["name"] == name]
    died, alive = _death(points)
    # Figures of the process that took the load: up to its death (a restarted process
    # starts its counters again at zero).
    serving = [i for _, i in alive]
    pre = [i["preemptions_total"] for i in serving if i.get("preemptions_total") is not None]
    preemptions = max(pre) - pre[0] if pre else None
    tok = [i.get("generation_tokens_per_s") for t, i in alive if inside(t)]
    return {
        "samples": len(points),
        "kv_peak": _max([i.get("kv_cache_usage") for i in serving]),
        "kv_capacity_tokens": _max([i.get("kv_capacity_tokens") for i in serving]),
        "preemptions": preemptions,
        "tokens_per_s_mean": _mean(tok),
        "tokens_per_s_peak": _max(tok),
        "requests_waiting_peak": _max([i.get("requests_waiting") for i in serving]),
        "hbm_peak_bytes": _max([i.get("hbm_bytes") for i in serving]),
        "hbm_source": next((i.get("hbm_source") for i in serving if i.get("hbm_source")), None),
        "backend": next((i.get("backend") for i in serving if i.get("backend")), None),
        "died": died,
    }


def _death(
    points: list[tuple[float, dict[str, Any]]],
) -> tuple[dict[str, Any] | None, list[tuple[float, dict[str, Any]]]]:
    """The first sample where the instance stopped serving or runs another process than the
    first one (when, its state, why, its log's last line), and the points before it; (None,
    every point) when it served throughout."""
    first_pid = points[0][1].get("pid") if points else None
    for n, (t, i) in enumerate(points):
        if i.get("state") not in SERVING or (first_pid and i.get("pid") != first_pid):
            le = i.get("last_exit") or {}
            excerpt = (le.get("log_excerpt") or "").strip().splitlines()
            died = {
                "at": t,
                "state": i.get("state"),
                "reason": le.get("reason"),
                "log_line": excerpt[-1][:300] if excerpt else None,
            }
            return died, points[:n]
    return None, points


def _gpu_summaries(
    samples: Sequence[tuple[float, dict[str, Any]]], inside: Callable[[float], bool]
) -> list[dict[str, Any]]:
    """Per GPU, by index: its name, HBM size and peak use, utilisation mean (in the window)
    and peak."""
    gpus: dict[int, dict[str, list]] = {}
    for t, doc in samples:
        for g in doc.get("gpus", ()):
            acc = gpus.setdefault(
                g["index"], {"hbm": [], "util": [], "util_in": [], "total": [], "name": []}
            )
            acc["hbm"].append(g.get("hbm_used_bytes"))
            acc["util"].append(g.get("util_pct"))
            acc["util_in"].append(g.get("util_pct") if inside(t) else None)
            acc["total"].append(g.get("hbm_total_bytes"))
            acc["name"].append(g.get("name"))
    return [
        {
            "index": idx,
            "name": next((n for n in acc["name"] if n), None),
            "hbm_total_bytes": _max(acc["total"]),
            "hbm_used_peak_bytes": _max(acc["hbm"]),
            "util_mean_pct": _mean(acc["util_in"]),
            "util_peak_pct": _max(acc["util"]),
        }
        for idx, acc in sorted(gpus.items())
    ]
