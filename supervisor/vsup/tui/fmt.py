"""Short, fixed-width renderings of snapshot values for the dashboard.

Pure functions (no Textual): the table diff compares their output, so two snapshots that
render the same text cause no widget work. Unknown values (`None`) render as `-`, never 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from vsup import sleepview
from vsup.layout.modelpath import is_local_model
from vsup.snapshot import Advice, InstanceStatus, RolloutStatus
from vsup.states import RolloutState, SleepState, State
from vsup.termtext import printable

UNKNOWN = "-"

# State -> (symbol, style). The symbol keeps states apart without colour (NO_COLOR, monochrome
# terminals, colour-blind operators); the style is only a second cue.
STATE_LOOK: dict[str, tuple[str, str]] = {
    "ready": ("●", "green"),
    "starting": ("◐", "yellow"),
    "unhealthy": ("▲", "bold red"),
    "backoff": ("↻", "yellow"),
    "stopping": ("◌", "dim"),
    "stopped": ("○", "dim"),
    "failed": ("✖", "bold red"),
}

# Sleep mode (docs/sleep.md): a sleeper stays `ready` but serves nothing; its row is dimmed.
SLEEP_SYMBOL = "☾"
SLEEP_STYLE = "dim"
SLEEP_ERROR_STYLE = "dim red"

SEVERITY_LOOK: dict[str, tuple[str, str]] = {
    "critical": ("✖", "bold red"),
    "warning": ("▲", "yellow"),
    "info": ("ℹ", "cyan"),
}


def state_label(state: str, backoff_remaining_s: float | None = None) -> str:
    """`● ready`; a backoff shows how long until the next attempt: `↻ backoff 12s`."""
    symbol, _ = STATE_LOOK.get(state, ("?", ""))
    if state == State.BACKOFF and backoff_remaining_s is not None:
        return f"{symbol} {state} {duration(backoff_remaining_s)}"
    return f"{symbol} {state}"


def stalled_label(stalled_for_s: float | None) -> str:
    """A ready instance that processes no token: `⏸ stall 1m05s` (its state stays ready);
    short enough for the state column."""
    return f"⏸ stall {duration(stalled_for_s)}"


def shows_sleep(inst: InstanceStatus) -> bool:
    """Whether its state cell tells its sleep rather than its state: it uses sleep mode, is
    not awake, and runs (a sleeper that stopped or failed shows that instead)."""
    return sleepview.sleeping(inst.sleep) and inst.lifecycle.state in (State.READY, State.UNHEALTHY)


def sleep_label(inst: InstanceStatus) -> str | None:
    """`☾ asleep L1`, `☾ waking…`, `☾ sleeping…` (falling asleep: out of the router, its
    requests ending, then vLLM's sleep), fit for the state column; None when `shows_sleep` is
    False."""
    if inst.sleep is None or not shows_sleep(inst):
        return None
    return f"{SLEEP_SYMBOL} {sleepview.state_word(inst.sleep, short=True)}"


def sleep_style(inst: InstanceStatus) -> str:
    """Dimmed (it serves nothing by design); dim red when its last sleep or wake failed."""
    if inst.sleep is not None and inst.sleep.error:
        return SLEEP_ERROR_STYLE
    return SLEEP_STYLE


def sleep_kept_bytes(inst: InstanceStatus) -> int | None:
    """The GPU memory a sleeper keeps: the daemon's figure for it, else what the probe sees
    its processes hold."""
    if inst.sleep is not None and inst.sleep.held_bytes is not None:
        return inst.sleep.held_bytes
    return inst.memory.hbm_bytes


def is_asleep(inst: InstanceStatus) -> bool:
    """Fully asleep (not on its way in or out): what `wake` applies to."""
    return inst.sleep is not None and inst.sleep.state == SleepState.ASLEEP


def state_style(state: str) -> str:
    return STATE_LOOK.get(state, ("?", ""))[1]


def size(nbytes: int | float | None) -> str:
    """Bytes in binary units, 3 significant figures: `512M`, `63.5G`, `1.2T`."""
    if nbytes is None:
        return UNKNOWN
    value = float(nbytes)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)}B"
    if abs(value) >= 100:
        return f"{value:.0f}{unit}"
    return f"{value:.1f}{unit}"


def gib(nbytes: int | float | None) -> str:
    """Bytes as GiB without a unit (for `used/total G` pairs): one decimal below 100."""
    if nbytes is None:
        return UNKNOWN
    value = nbytes / 2**30
    return f"{value:.0f}" if value >= 99.95 else f"{value:.1f}"


def count(value: float | None) -> str:
    """A count or rate, compact: `7`, `12.5`, `1.2k`, `3.4M`."""
    if value is None:
        return UNKNOWN
    v = float(value)
    if abs(v) >= 1_000_000:
        return f"{v / 1_000_000:.1f}M"
    if abs(v) >= 10_000:
        return f"{v / 1000:.0f}k"
    if abs(v) >= 1000:
        return f"{v / 1000:.1f}k"
    if v.is_integer():
        return str(int(v))
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}"


def percent(fraction: float | None) -> str:
    """A 0..1 fraction as a whole percentage: `87%`."""
    if fraction is None:
        return UNKNOWN
    return f"{fraction * 100:.0f}%"


def duration(seconds: float | None) -> str:
    """Two most significant units: `45s`, `12m03s`, `3h12m`, `5d02h`."""
    if seconds is None:
        return UNKNOWN
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def gpus(indices: tuple[int, ...]) -> str:
    """`0`, `0,1`, `0-3`; `cpu` for an instance without a GPU."""
    if not indices:
        return "cpu"
    ordered = sorted(indices)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(i) for i in ordered)


def running_waiting(running: float | None, waiting: float | None) -> str:
    return f"{count(running)}/{count(waiting)}"


def backend(name: str | None, source: str | None) -> str:
    """The attention backend and where it came from: read from the startup log, or inferred
    from the `--attention-backend` flag or the platform default (`CPU_ATTN ~flag`)."""
    if name is None:
        return UNKNOWN
    if source == "log":
        return name
    if source == "flag":
        return f"{name} ~flag"
    if source == "default":
        return f"{name} ~dflt"
    return name


def truncate(text: str, width: int) -> str:
    """Cut `text` to `width` cells with an ellipsis."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    return text[: width - 1] + "…"


def model_label(inst: InstanceStatus) -> str | None:
    """What the MODEL column says: the name vLLM serves the model under (what clients ask
    for), else a local path's last component, else the hub id; the full path is in the
    detail pane's Config tab."""
    if inst.served_model_name:
        return safe(inst.served_model_name)
    if not inst.model:
        return None
    model = inst.model
    if is_local_model(model):
        model = model.rstrip("/").rsplit("/", 1)[-1] or model
    return safe(model)


def model_name(model: str | None, width: int) -> str:
    """A model name in `width` cells: whole when it fits, else a hub id without its
    organisation (`Llama-3.1-8B-Instruct`), cut at the end (`Llama-3.1-8B-Ins…`): the
    family and size are what tell models apart."""
    if model is None:
        return UNKNOWN
    if len(model) <= width:
        return model
    if "/" in model:
        model = model.rsplit("/", 1)[-1] or model
    return truncate(model, width)


def safe(text: str | None) -> str:
    """Text from a layout, a log or the daemon with its control characters escaped
    (termtext.printable): a name cannot drive the terminal."""
    return printable("" if text is None else text)


def short_duration(seconds: float | None) -> str:
    """`duration` without a zero tail: `20m`, `1h`, `2m10s`."""
    text = duration(seconds)
    for zero in ("m00s", "h00m"):
        if text.endswith(zero):
            return text[: -len(zero) + 1]
    return text


def wait_cell(inst: InstanceStatus) -> str | None:
    """The state cell of an instance that waits or starts: `◐ after b`, `◐ GPU memory`,
    `◐ 2m10s of 20m` (`◐ start 2m10s` without a start timeout); None when its state says
    enough."""
    symbol = STATE_LOOK.get(inst.lifecycle.state, ("?", ""))[0]
    w = inst.lifecycle.wait
    if inst.lifecycle.state == State.STARTING and w is not None:
        if w.kind in ("co_tenant", "start_slot") and w.instances:
            return f"{symbol} after {safe(w.instances[0])}"
        if w.kind == "gpu_memory":
            return f"{symbol} GPU memory"
        return f"{symbol} waiting"
    if inst.lifecycle.state == State.STARTING and inst.lifecycle.start_elapsed_s is not None:
        if inst.lifecycle.start_timeout_s:
            # its progress against start_timeout_s, as `vsup status` says it
            of = short_duration(inst.lifecycle.start_timeout_s)
            return f"{symbol} {duration(inst.lifecycle.start_elapsed_s)} of {of}"
        return f"{symbol} start {duration(inst.lifecycle.start_elapsed_s)}"
    return None


def wait_summary(inst: InstanceStatus) -> str | None:
    """One line for the detail pane: what it waits for, how far its start is, or that it
    runs an older spec than the layout; None when none applies."""
    parts = []
    w = inst.lifecycle.wait
    if w is not None:
        if w.kind == "backoff":
            parts.append(f"backing off: {safe(w.message)}")
        else:
            parts.append(f"waits for {safe(w.message)}")
    elif inst.lifecycle.state == State.STARTING and inst.lifecycle.start_elapsed_s is not None:
        of = (
            f" of {short_duration(inst.lifecycle.start_timeout_s)}"
            if inst.lifecycle.start_timeout_s
            else ""
        )
        parts.append(f"starting {duration(inst.lifecycle.start_elapsed_s)}{of} (start_timeout_s)")
    if inst.lifecycle.outdated:
        differ = ", ".join(inst.lifecycle.outdated_fields) or "spec"
        parts.append(f"runs an older spec than the layout ({differ} differ)")
    return " · ".join(parts) or None


def rollout_mark(r: RolloutStatus | None) -> tuple[str, str] | None:
    """The header's rollout mark and style: ` ROLLOUT 1/2 ` while one runs, a red one when it
    failed or was interrupted with instances left on their old config; None otherwise."""
    if r is None:
        return None
    if r.state == RolloutState.RUNNING:
        return (f" ROLLOUT {r.wave}/{r.waves} ", "bold black on cyan")
    if r.state == RolloutState.FAILED and r.old_config:
        return (" ROLLOUT FAILED ", "bold white on red")
    if r.state == RolloutState.INTERRUPTED and r.old_config:
        return (" ROLLOUT INTERRUPTED ", "bold white on red")
    return None


# Advice kind -> the few words the header says about it (others: the kind in words).
ALERT_REASON: dict[str, str] = {
    "kv_exhausted": "KV cache too small",
    "hbm_over_plan": "HBM over plan",
    "crash_loop": "crash loop",
    "failed": "failed",
    "stalled": "stalled",
    "foreign_process": "foreign process",
    "pull_failed": "pull failed",
    "gpu_throttle": "GPU throttled",
    "router_foreign_worker": "foreign router worker",
    "rollout_interrupted": "rollout interrupted",
    "state_file": "state file",
}
SEVERITY_RANK = {"critical": 0, "error": 0, "warning": 1, "info": 2}


def worst_alert(advice: Iterable[Advice]) -> Advice | None:
    """The most severe advice (the daemon's order among equals); None without any."""
    return min(advice, key=lambda a: SEVERITY_RANK.get(a.severity, 3), default=None)


def alert_label(a: Advice) -> str:
    """`cpu0 crash loop`, `GPU 3: foreign GPU process`, `state file`: who and why, short."""
    reason = ALERT_REASON.get(a.kind, a.kind.replace("_", " "))
    if a.instance:
        return f"{safe(a.instance)} {reason}"
    if a.gpu is not None:
        return f"GPU {a.gpu}: {reason}"
    return reason
