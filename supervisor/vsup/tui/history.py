"""Recent values of the sparkline metrics, per instance, and their rendering.

Seeded from the daemon's history route when an instance is first selected, then appended from
each snapshot. Pure: no Textual.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from vsup.answers import History as HistoryAnswer
from vsup.snapshot import StatusSnapshot

# metric key in the snapshot and the history route -> sparkline label
METRICS: tuple[tuple[str, str], ...] = (
    ("kv_cache_usage", "KV"),
    ("generation_tokens_per_s", "tok/s"),
    ("preemptions_per_min", "pre/m"),
)
KEEP = 600  # ten minutes at the daemon's 1 Hz
BARS = "▁▂▃▄▅▆▇█"


class History:
    """Per instance and metric, the last `KEEP` values (None where unknown)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._series: dict[str, dict[str, deque[float | None]]] = {}
        self.seeded: set[str] = set()

    def _for(self, name: str) -> dict[str, deque[float | None]]:
        series = self._series.get(name)
        if series is None:
            series = {key: deque(maxlen=self.keep) for key, _ in METRICS}
            self._series[name] = series
        return series

    def append(self, snapshot: StatusSnapshot) -> None:
        """Add each instance's current values; forget instances no longer in the snapshot."""
        names = set()
        for inst in snapshot.instances:
            names.add(inst.name)
            series = self._for(inst.name)
            for key, _ in METRICS:
                series[key].append(getattr(inst.telemetry, key))  # telemetry's figures
        for gone in set(self._series) - names:
            del self._series[gone]
            self.seeded.discard(gone)

    def seed(self, name: str, doc: HistoryAnswer) -> None:
        """Put the daemon's history before what this dashboard has seen itself."""
        series = self._for(name)
        for key, _ in METRICS:
            older = list(getattr(doc, key))
            series[key] = deque([*older, *series[key]], maxlen=self.keep)
        self.seeded.add(name)

    def values(self, name: str, key: str) -> Sequence[float | None]:
        series = self._series.get(name)
        return tuple(series[key]) if series else ()


def spark(values: Iterable[float | None], width: int, top: float | None = None) -> str:
    """The last `width` values as bars, scaled 0..`top` (0..max of the values when None);
    unknown values are blanks, so a gap in telemetry shows as a gap."""
    tail = list(values)[-width:] if width > 0 else []
    known = [v for v in tail if v is not None]
    scale = top if top is not None else (max(known) if known else 0.0)
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        elif scale <= 0:
            out.append(BARS[0])
        else:
            level = round(min(max(v / scale, 0.0), 1.0) * (len(BARS) - 1))
            out.append(BARS[level])
    return " " * (width - len(out)) + "".join(out)
