"""The ranks list of a data-parallel instance, for the detail side panel.

One line per rank: its index, GPUs, the pid of its `VLLM::EngineCore_DP{r}` process, its state
and the HBM it holds. Pure (Rich text, no widget): the panel shows it only when there are ranks.
"""

from __future__ import annotations

from rich.text import Text

from vsup.snapshot import InstanceStatus, RankStatus
from vsup.tui import fmt

# alive -> (symbol + word, style): the symbol keeps states apart without colour
_RANK_STATE = {
    True: ("● alive", "green"),
    False: ("✖ dead", "bold red"),
    None: ("○ not seen", "dim"),
}


def rank_line(rank: RankStatus) -> tuple[str, str]:
    """(text, style) of one rank: `DP1  GPU 1    pid 7948   ✖ dead    -`."""
    state, style = _RANK_STATE[rank.alive]
    gpus = fmt.gpus(rank.gpus) if rank.gpus else "cpu"
    pid = str(rank.pid) if rank.pid is not None else fmt.UNKNOWN
    hbm = fmt.size(rank.hbm_bytes)
    return f"DP{rank.rank:<3} GPU {gpus:<5} pid {pid:<8} {state:<10} {hbm}", style


def ranks_text(inst: InstanceStatus | None) -> Text:
    """`ranks  TP1 x DP2` and a line per rank; empty for an instance without DP ranks."""
    if inst is None or not inst.ranks:
        return Text("")
    label = inst.parallel.label if inst.parallel is not None else ""
    text = Text.assemble(("ranks ", "bold"), (label, "dim"))
    for rank in inst.ranks:
        line, style = rank_line(rank)
        text.append("\n")
        text.append(line, style)
    return text
