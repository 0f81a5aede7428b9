"""The rollout line: shown while a rolling apply restarts instances, and after one failed or
was interrupted (its daemon killed) while instances still run their old config, because an
instance going down one after another is a layout change, not an incident - and a change
left half-done is one nobody should miss."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from vsup.snapshot import RolloutStatus
from vsup.states import RolloutState
from vsup.tui import fmt


def shown(rollout: RolloutStatus | None) -> bool:
    """Whether the line is shown for `rollout` (the header's mark follows the same rule)."""
    return fmt.rollout_mark(rollout) is not None


def rollout_text(r: RolloutStatus) -> Text:
    """`⟳ rollout wave 1/2: restarting a · 0/2 done · pending b (old config until its wave)`;
    `✖ rollout failed at wave 2/3: ... · old config: c`; `▲ rollout interrupted ...`."""
    text = Text(no_wrap=True, overflow="ellipsis")
    names = ", ".join(fmt.safe(n) for n in r.current) or "-"
    if r.state == RolloutState.RUNNING:
        text.append("⟳ rollout", "bold")
        text.append(f" wave {r.wave}/{r.waves}", "bold")
        text.append(f": restarting {names} · {r.done}/{r.total} done")
        if r.pending:
            text.append(f" · pending {', '.join(fmt.safe(n) for n in r.pending)}")
            text.append(" (old config until their wave)", "dim")
        return text
    old = ", ".join(fmt.safe(n) for n in r.old_config)
    if r.state == RolloutState.FAILED:
        text.append("✖ rollout failed", "bold red")
        text.append(f" at wave {r.wave}/{r.waves}: {fmt.safe(r.failure or '?')}")
        text.append(f" · old config: {old}", "bold")
        return text
    text.append("▲ rollout interrupted", "bold red")
    text.append(f" at wave {r.wave}/{r.waves} ({r.done}/{r.total} done; its daemon ended): ")
    text.append(f"{old} still run the old config", "bold")
    text.append(" · `vsup up LAYOUT` finishes it", "dim")
    return text


class RolloutBar(Static):
    """One line under the header while a rollout runs or was left half-done; hidden
    otherwise."""

    DEFAULT_CSS = """
    RolloutBar { height: 1; background: $accent 30%; padding: 0 1; display: none; }
    RolloutBar.-shown { display: block; }
    RolloutBar.-bad { background: $error 30%; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._shown: str | None = None

    def show(self, rollout: RolloutStatus | None) -> bool:
        """Show `rollout` (None, or one that ended well, hides the line). True when the line
        appeared or went."""
        was = self.has_class("-shown")
        if rollout is None or not shown(rollout):
            self._shown = None
            self.remove_class("-shown")
            return was
        text = rollout_text(rollout)
        if text.plain != self._shown:
            self._shown = text.plain
            self.update(text)
        self.set_class(rollout.state != RolloutState.RUNNING, "-bad")
        self.add_class("-shown")
        return not was
