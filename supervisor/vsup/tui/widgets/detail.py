"""The selected instance: sparklines, the advice that applies now, its last exit, its log tail
and its effective config."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane

from vsup import sleepview
from vsup.answers import InstanceConfig
from vsup.layout.secrets import SECRET_NAME as _SECRET
from vsup.snapshot import Advice, InstanceStatus, LastExit, StallStatus
from vsup.states import ExitReason, State
from vsup.termtext import printable
from vsup.tui import fmt
from vsup.tui.history import METRICS, History, spark
from vsup.tui.ranks import ranks_text
from vsup.tui.widgets.livelog import LiveLog

MASK = "****"
# uvicorn's access lines for the requests vsup itself makes every second (health checks and
# metric scrapes): they would bury everything else in the log tail.
_PROBE_LINE = re.compile(r'"(GET|HEAD) /(health|metrics|load|version)\b[^"]*" \d{3}')


def is_shown(line: str) -> bool:
    """False for the access-log line of one of vsup's own /health or /metrics requests."""
    return "HTTP/" not in line or not _PROBE_LINE.search(line)


def without_probes(text: str) -> str:
    """`text` without the access-log lines of vsup's own /health and /metrics requests."""
    if "HTTP/" not in text:
        return text
    return "".join(line for line in text.splitlines(keepends=True) if not _PROBE_LINE.search(line))


SERVING = ("ready", "unhealthy")


def not_serving_text(inst: InstanceStatus) -> Text:
    """What the sparkline lines say of an instance that serves nothing now: the history is
    its previous run's, and beside today's `-` it would read as this run's figures."""
    text = Text()
    text.append(
        f"{fmt.state_label(inst.lifecycle.state, inst.lifecycle.backoff_remaining_s)}", "bold"
    )
    summary = fmt.wait_summary(inst)
    if summary:
        text.append("\n" + summary)
    elif inst.lifecycle.state == State.STARTING:
        text.append("\nstarting: no figures until it serves", "dim")
    else:
        text.append("\nno figures while it does not serve", "dim")
    return text


def sleep_text(inst: InstanceStatus | None) -> Text:
    """Sleep mode of the selected instance (empty without it): where it is and since when,
    level, swap group, what the last sleep and wake took, what it keeps, the idle-sleep
    countdown, and why the last sleep or wake failed (in red)."""
    if inst is None or inst.sleep is None:
        return Text("")
    s = inst.sleep
    text = Text("sleep ", "bold")
    parts = sleepview.detail_parts(s)
    if s.error:
        parts = parts[:-1]
    text.append(" · ".join(fmt.safe(p) for p in parts), "dim" if not fmt.shows_sleep(inst) else "")
    if s.error:
        text.append(f"\nlast sleep/wake failed: {fmt.safe(s.error)}", "red")
    return text


def sleeping_text(inst: InstanceStatus) -> Text:
    """What the sparkline lines say of a sleeper: it serves nothing by choice, and how to
    wake it (its figures would only be flat lines)."""
    assert inst.sleep is not None
    text = Text()
    text.append(f"{fmt.sleep_label(inst)}", "bold")
    text.append(f"\n{sleepview.detail_parts(inst.sleep)[0]}: serves nothing, routes none", "dim")
    text.append("\na wake or a swap (ctrl+p) brings it back", "dim")
    return text


class SparkPanel(Widget):
    """KV %, generation tok/s and preemptions/min of the selected instance, one line each;
    for an instance that does not serve, what it waits for or how far its start is."""

    DEFAULT_CSS = """
    SparkPanel { height: 3; }
    """

    def __init__(self, history: History, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.instance: InstanceStatus | None = None
        self._key: tuple | None = None

    def show(self, instance: InstanceStatus | None) -> None:
        self.instance = instance
        key = self._content_key()
        if key != self._key:
            self._key = key
            self.refresh()

    def _content_key(self) -> tuple:
        inst = self.instance
        if inst is None:
            return (None, self.size.width)
        if inst.lifecycle.state not in SERVING:
            return (inst.name, self.size.width, not_serving_text(inst).plain)
        if fmt.shows_sleep(inst):
            return (inst.name, self.size.width, sleeping_text(inst).plain)
        width = self._spark_width()
        return (
            inst.name,
            self.size.width,
            inst.telemetry.kv_capacity_tokens,
            *(tuple(self.history.values(inst.name, k)[-width:]) for k, _ in METRICS),
        )

    def _spark_width(self) -> int:
        return max(1, self.size.width - 6 - 13)

    def render(self) -> Text:
        inst = self.instance
        if inst is None:
            return Text("no instance selected", "dim")
        if inst.lifecycle.state not in SERVING:
            return not_serving_text(inst)
        if fmt.shows_sleep(inst):
            return sleeping_text(inst)
        width = self._spark_width()
        lines = []
        for key, label in METRICS:
            values = self.history.values(inst.name, key)
            current = values[-1] if values else None
            if key == "kv_cache_usage":
                shown = fmt.percent(current)
                if inst.telemetry.kv_capacity_tokens is not None:
                    shown += f" of {fmt.count(inst.telemetry.kv_capacity_tokens)}"
                bars = spark(values, width, top=1.0)
                style = "red" if (current or 0) >= 0.95 else "cyan"
            else:
                shown = fmt.count(current)
                bars = spark(values, width)
                style = "red" if key == "preemptions_per_min" and (current or 0) > 0 else "cyan"
            lines.append(Text.assemble((f"{label:<6}", "bold"), (bars, style), f" {shown}"))
        return Text("\n").join(lines)


def advice_text(advice: Sequence[Advice], name: str | None) -> Text:
    """The advice for `name` and the node-wide advice, worst first."""
    order = {"critical": 0, "warning": 1, "info": 2}
    relevant = sorted(
        (a for a in advice if a.instance in (None, name)), key=lambda a: order.get(a.severity, 3)
    )
    if not relevant:
        return Text("no advice: nothing needs attention", "dim")
    text = Text()
    for i, a in enumerate(relevant):
        symbol, style = fmt.SEVERITY_LOOK.get(a.severity, ("•", ""))
        if i:
            text.append("\n")
        text.append(f"{symbol} ", style)
        where = f"GPU {a.gpu}: " if a.gpu is not None and a.instance is None else ""
        # GPU advice already says which GPU (seen on the H200: "GPU 0: GPU 0: held at ...")
        message = fmt.safe(a.message)
        text.append(message if message.startswith(where) else where + message)
    return text


def exit_summary(last: LastExit | None) -> str:
    """`oom (exit 1) at 12:03:04Z` or `killed (SIGKILL) at ...`."""
    if last is None:
        return "no exit yet"
    how = f"exit {last.code}" if last.code is not None else (last.signal or "?")
    at = last.at.split("T", 1)[-1] if "T" in last.at else last.at
    what = "stalled" if last.reason == ExitReason.STALLED else "died first"
    rank = f", data-parallel rank {last.rank} {what}" if last.rank is not None else ""
    return f"{last.reason} ({how}) at {at}{rank}"


def stall_summary(inst: InstanceStatus) -> str:
    """`stalled 1m5s: 3 running, 5 waiting, no token since 12:03:04Z (/health 200)`; the work
    is the API server's requests in flight when only it shows them (a freeze that began while
    idle), a lost canary, and names the data-parallel ranks that stalled."""
    stall = inst.stall if inst.stall is not None else StallStatus(stalled=True)
    tel = inst.telemetry
    since = stall.since or ""
    at = since.split("T", 1)[-1] if "T" in since else since
    if stall.evidence == "server":
        work = f"{tel.requests_in_flight or 0} in flight at the API server, none at the engine"
    elif stall.evidence == "canary":
        work = "a canary request unanswered"
    else:
        work = f"{int(tel.requests_running or 0)} running, {int(tel.requests_waiting or 0)} waiting"
    if stall.ranks:
        work = "DP rank " + ",".join(str(r) for r in stall.ranks) + ": " + work
    return f"stalled {fmt.duration(stall.for_s)}: {work}, no token since {at or '?'} (/health 200)"


def exit_text(inst: InstanceStatus | None) -> Text:
    if inst is None:
        return Text("no instance selected", "dim")
    text = Text()
    if inst.active_stall is not None:
        text.append(stall_summary(inst) + "\n", "bold red")
    summary = fmt.wait_summary(inst)
    if summary:
        text.append(summary + "\n", "bold yellow")
    sleep = sleep_text(inst)
    if sleep.plain:
        text.append_text(sleep)
        text.append("\n")
    text.append_text(Text.assemble(("last exit  ", "bold"), exit_summary(inst.lifecycle.last_exit)))
    text.append(f"\nrestarts   {inst.lifecycle.restarts}")
    if inst.lifecycle.state == State.BACKOFF and inst.lifecycle.backoff_remaining_s is not None:
        text.append(f"\nnext start in {fmt.duration(inst.lifecycle.backoff_remaining_s)}")
    if inst.lifecycle.state == State.FAILED:
        text.append(
            "\n"
            + fmt.safe(
                inst.lifecycle.failed_why
                or "crash loop: the restart policy gave up; start it by hand once fixed"
            ),
            "bold red",
        )
    if inst.lifecycle.last_exit and inst.lifecycle.last_exit.log_excerpt:
        text.append("\n\n")
        text.append(printable(inst.lifecycle.last_exit.log_excerpt, newlines=True), "italic")
    return text


def masked_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The environment with secret-looking values masked (the daemon masks too)."""
    return {
        k: (MASK if _SECRET.search(k) and not str(v).startswith("*") else str(v))
        for k, v in env.items()
    }


def config_text(config: InstanceConfig | None) -> Text:
    """argv, env (secrets masked) and the cache config vLLM reported."""
    if config is None:
        return Text("loading…", "dim")
    text = Text()
    argv = [str(a) for a in config.argv]
    model = config.spec.get("model")
    if model:
        # the whole path or hub id (the table shows the name it is served under)
        text.append("model    ", "bold")
        text.append(fmt.safe(str(model)))
        if "--served-model-name" in argv[:-1]:
            served = argv[argv.index("--served-model-name") + 1]
            text.append(f" (served as {fmt.safe(served)})", "dim")
        text.append("\n")
    text.append("command  ", "bold")
    text.append(shlex.join(argv) if argv else fmt.UNKNOWN)
    env = masked_env(config.env)
    text.append("\nenv      ", "bold")
    if env:
        text.append("\n         ".join(f"{k}={v}" for k, v in sorted(env.items())))
    else:
        text.append(fmt.UNKNOWN)
    cache = config.cache_config or {}
    text.append("\ncache    ", "bold")
    if cache:
        text.append("\n         ".join(f"{k} = {v}" for k, v in cache.items()))
    else:
        text.append("not reported yet (vLLM publishes it once ready)", "dim")
    return text


def memory_text(inst: InstanceStatus | None) -> Text:
    """What vLLM's start-up log said about its GPU memory (empty when it said nothing):
    what the over-plan advice weighs the HBM figure against."""
    if inst is None:
        return Text("")
    parts = [
        ("target", inst.memory.vllm_requested_hbm_bytes),
        ("weights", inst.memory.vllm_weights_bytes),
        ("KV", inst.memory.vllm_kv_cache_bytes),
        ("activation", inst.memory.vllm_activation_bytes),
        ("non-torch", inst.memory.vllm_non_torch_bytes),
        ("CUDA graphs", inst.memory.vllm_cudagraph_bytes),
    ]
    known = [(label, n) for label, n in parts if n is not None]
    if not known:
        return Text("")
    text = Text("vLLM memory ", "bold")
    text.append(" · ".join(f"{label} {n / 2**30:.2f}" for label, n in known) + " GiB", "dim")
    if inst.memory.hbm_start_bytes is not None:
        text.append(f" · held at start {inst.memory.hbm_start_bytes / 2**30:.1f} GiB", "dim")
    return text


class SidePanel(Vertical):
    """Sparklines, then advice and the last exit of the selected instance."""

    DEFAULT_CSS = """
    SidePanel { border: round $primary 50%; padding: 0 1; }
    SidePanel #advice { height: auto; margin-top: 1; }
    SidePanel #exit-line { height: auto; margin-top: 1; }
    SidePanel #memory { height: auto; margin-top: 1; }
    SidePanel #sleep { height: auto; margin-top: 1; }
    SidePanel #ranks { height: auto; margin-top: 1; }
    """

    def __init__(self, history: History, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history

    def compose(self) -> ComposeResult:
        yield SparkPanel(self.history, id="sparks")
        with VerticalScroll(id="side-scroll"):
            yield Static(id="advice")
            yield Static(id="sleep")
            yield Static(id="memory")
            yield Static(id="ranks")
            yield Static(id="exit-line")

    def show(self, inst: InstanceStatus | None, advice: Sequence[Advice]) -> None:
        self.query_one(SparkPanel).show(inst)
        name = inst.name if inst else None
        shown = fmt.safe(name)
        title = f"{shown} · {fmt.state_label(inst.lifecycle.state)}" if inst else "no selection"
        stall = inst.active_stall if inst is not None else None
        if stall is not None:
            title = f"{shown} · {fmt.stalled_label(stall.for_s)}"
        elif inst is not None and fmt.shows_sleep(inst):
            title = f"{shown} · {fmt.sleep_label(inst)}"
        if self.border_title != title:
            self.border_title = title
        _update_if_changed(self.query_one("#advice", Static), advice_text(advice, name))
        sleep = self.query_one("#sleep", Static)
        sleep_line = sleep_text(inst)
        sleep.display = bool(sleep_line.plain)
        _update_if_changed(sleep, sleep_line)
        memory = self.query_one("#memory", Static)
        memory_line = memory_text(inst)
        memory.display = bool(memory_line.plain)
        _update_if_changed(memory, memory_line)
        ranks = self.query_one("#ranks", Static)
        ranks_line = ranks_text(inst)
        ranks.display = bool(ranks_line.plain)
        _update_if_changed(ranks, ranks_line)
        exit_line = Text("")
        if inst is not None and inst.lifecycle.last_exit is not None:
            exit_line = Text.assemble(
                ("last exit ", "bold"), exit_summary(inst.lifecycle.last_exit)
            )
        summary = fmt.wait_summary(inst) if inst is not None else None
        if summary and inst is not None and inst.lifecycle.state in SERVING:
            # (not serving: the sparkline lines above say it already)
            exit_line = Text.assemble((summary, "bold yellow"), "\n", exit_line)
        if inst is not None and inst.active_stall is not None:
            exit_line = Text.assemble((stall_summary(inst), "bold red"), "\n", exit_line)
        _update_if_changed(self.query_one("#exit-line", Static), exit_line)


def _update_if_changed(widget: Static, text: Text) -> None:
    previous = getattr(widget, "_vsup_shown", None)
    key = (text.plain, tuple(text.spans))
    if previous != key:
        widget._vsup_shown = key  # type: ignore[attr-defined]
        widget.update(text)


class DetailTabs(TabbedContent):
    """Log tail, effective config and last exit of the selected instance."""

    DEFAULT_CSS = """
    DetailTabs { height: 1fr; }
    DetailTabs Log { height: 1fr; }
    """

    @staticmethod
    def panes() -> list[TabPane]:
        """The tab panes, composed inside `with DetailTabs():` (TabbedContent's contract)."""
        return [
            TabPane(
                "Log",
                LiveLog(max_lines=2000, id="log-tail", auto_scroll=True, keep=is_shown),
                id="tab-log",
            ),
            TabPane(
                "Config", VerticalScroll(Static(config_text(None), id="config")), id="tab-config"
            ),
            TabPane("Exit", VerticalScroll(Static(exit_text(None), id="exit")), id="tab-exit"),
        ]

    def show_instance(self, inst: InstanceStatus | None) -> None:
        _update_if_changed(self.query_one("#exit", Static), exit_text(inst))

    def show_config(self, config: InstanceConfig | None) -> None:
        _update_if_changed(self.query_one("#config", Static), config_text(config))

    def log_write(self, text: str, reset: bool) -> None:
        """Append a chunk of the selected instance's log (`reset`: a new log)."""
        log = self.query_one("#log-tail", LiveLog)
        if reset:
            log.reset()
        log.feed(text)
