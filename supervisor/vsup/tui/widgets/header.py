"""The top line (node, GPUs, daemon uptime, ready/total, alerts) and the daemon banner."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from vsup.snapshot import StatusSnapshot
from vsup.states import PullState, State
from vsup.tui import fmt

SEP = " │ "


def header_text(
    snapshot: StatusSnapshot | None, readonly: bool, narrow: bool, width: int | None = None
) -> Text:
    """`vsup │ node │ NVIDIA ×8 │ up 3h12m │ ready 7/8 (2 asleep) │ ▲ 2 alerts · worst: gpu7
    crash loop │ BENCH 2/3 │ ROLLOUT 1/2 │ PULL 43% │ READ-ONLY`. The worst alert's words take
    what `width` leaves (cut with `…`), so the marks after it stay on the line."""
    text = Text()
    head: Text | None = None  # the text before the worst alert's label
    label: tuple[str, str, str] | None = None  # its lead, the label and its style
    text.append(" vsup ", "bold reverse")
    if snapshot is None:
        text.append("  connecting to the daemon…", "dim")
    else:
        _node(text, snapshot, narrow)
        text.append(SEP)
        label = _alerts(text, snapshot, narrow)
        if label is not None:
            # the worst alert's words are placed below, once the width the rest of the line
            # takes is known
            head, text = text, Text()
        _marks(text, snapshot)
    if readonly:
        text.append("  ")
        text.append(" READ-ONLY ", "bold reverse")
    if head is None or label is None:
        return text
    lead, words, style = label
    room = 48 if width is None else width - head.cell_len - text.cell_len - len(lead)
    if room >= 12:  # else the count alone: a cut name would say nothing
        head.append(lead)
        head.append(fmt.truncate(words, min(room, 48)), style)
    return head + text


def _node(text: Text, snapshot: StatusSnapshot, narrow: bool) -> None:
    """The node, the router's endpoint, the GPUs, the daemon's uptime, ready/total."""
    node = snapshot.node
    text.append(" " + fmt.safe(node.hostname), "bold")
    text.append(SEP)
    router = snapshot.router
    # narrow: a ready router's endpoint is left to the instance table's bottom line (it
    # names it there), so that the alert count and the worst alert keep their room
    if router is not None and not (narrow and router.state == State.READY):
        # the one endpoint clients should use
        ok = router.state == State.READY
        text.append(
            f"{'' if narrow else 'router '}{fmt.safe(router.endpoint)}",
            "bold" if ok else "bold red",
        )
        if not ok:
            text.append(f" {router.state}", "bold red")
        text.append(SEP)
    if node.gpu_vendor == "none" or node.gpu_count == 0:
        text.append("CPU node" if narrow else "no GPUs (CPU node)")
    else:
        text.append(f"{node.gpu_vendor.upper()} ×{node.gpu_count}")
    text.append(SEP)
    text.append(f"{'' if narrow else 'daemon '}up {fmt.duration(snapshot.supervisor.uptime_s)}")
    text.append(SEP)
    ready, total = snapshot.ready_count, len(snapshot.instances)
    text.append(f"ready {ready}/{total}", "green" if ready == total else "bold yellow")
    asleep = sum(1 for i in snapshot.instances if fmt.shows_sleep(i))
    if asleep:
        # sleepers count as ready (live, healthy) but serve nothing: say how many
        text.append(f" {fmt.SLEEP_SYMBOL}{asleep}" if narrow else f" ({asleep} asleep)", "dim")


def _alerts(text: Text, snapshot: StatusSnapshot, narrow: bool) -> tuple[str, str, str] | None:
    """The alert count; the worst alert's lead, label and style when there is one (which one
    and why: the side panel has the whole advice)."""
    alerts = len(snapshot.advice)
    if not alerts:
        text.append("no alerts", "dim")
        return None
    text.append(f"▲ {alerts} alert{'s' if alerts != 1 else ''}", "bold red")
    worst = fmt.worst_alert(snapshot.advice)
    if worst is None:
        return None
    return (
        " · " if alerts == 1 or narrow else " · worst: ",
        fmt.alert_label(worst),
        fmt.SEVERITY_LOOK.get(worst.severity, ("", ""))[1],
    )


def _marks(text: Text, snapshot: StatusSnapshot) -> None:
    """BENCH/TUNE, the rollout and the pulls: what is under way on the node."""
    bench = snapshot.bench
    if bench is not None:
        # the layout under test (a bench's or a tune's) replaced the running one: say so
        # where the eye lands first
        of = f" {bench.index}/{bench.count}" if bench.index and bench.count else ""
        text.append(SEP)
        text.append(f" {bench.tool.upper()}{of} ", "bold black on yellow")
    mark = fmt.rollout_mark(snapshot.rollout)
    if mark is not None:
        # a layout change in progress (or left half-done): the rollout line says more
        text.append(SEP)
        text.append(*mark)
    pulling = [p for p in snapshot.pulls if p.state == PullState.PULLING]
    if any(p.state == PullState.FAILED for p in snapshot.pulls):
        text.append(SEP)
        text.append(" PULL FAILED ", "bold white on red")
    elif pulling:
        # instances wait for their weights: not an outage
        done = sum(p.bytes_done or 0 for p in pulling)
        total = sum(p.bytes_total or 0 for p in pulling)
        pct = f" {min(100, int(100 * done / total))}%" if total else ""
        text.append(SEP)
        text.append(f" PULL{pct} ", "bold black on cyan")


class NodeHeader(Static):
    """One line about the node and the daemon; repainted only when its text changes."""

    DEFAULT_CSS = """
    NodeHeader { height: 1; background: $panel; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._shown: Text | None = None

    def show(self, snapshot: StatusSnapshot | None, readonly: bool, narrow: bool) -> None:
        text = header_text(snapshot, readonly, narrow, self.app.size.width)
        if (
            self._shown is None
            or text.plain != self._shown.plain
            or text.spans != self._shown.spans
        ):
            self._shown = text
            self.update(text, layout=False)  # one line, always: no relayout of the screen


class Banner(Static):
    """Shown while the daemon does not answer; the dashboard keeps retrying."""

    DEFAULT_CSS = """
    Banner { height: auto; background: $error; color: $text; padding: 0 1; display: none; }
    Banner.-shown { display: block; }
    """

    def show_error(self, error: str | None) -> None:
        if error is None:
            self.remove_class("-shown")
            return
        self.update(
            Text.assemble(
                ("✖ daemon unreachable: ", "bold"), error, " — retrying; instances keep running."
            )
        )
        self.add_class("-shown")
