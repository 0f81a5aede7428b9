"""The log as a terminal shows it: tqdm bars at their last state, on a real vLLM 0.26 log."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import cast

from vsup.answers import LogChunk
from vsup.commands.logs import follow
from vsup.control.client import Client
from vsup.logtext import TerminalLines, bar_state, collapse, render_line

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm-0.26-cuda" / "startup.log"


def real_log() -> str:
    return FIXTURE.read_bytes().decode("utf-8", errors="replace")


def bar_lines(lines, desc):
    return [line for line in lines if (s := bar_state(line)) is not None and s.desc == desc]


def test_real_startup_log_shows_each_bar_once_at_its_last_state():
    text = real_log()
    assert text.count("\r") > 10  # the fixture really redraws its bars in place
    shown = collapse(text).splitlines()
    assert not any("\r" in line for line in shown)
    for desc in ("Capturing CUDA graphs (PIECEWISE)", "Capturing CUDA graphs (FULL)"):
        bars = bar_lines(shown, desc)
        assert len(bars) == 1, bars
        state = bar_state(bars[0])
        assert state is not None and f"{state.n:.0f}" == state.total  # the last state: done
    loading = bar_lines(shown, "Loading safetensors checkpoint shards")
    assert len(loading) == 1 and "100% Completed" in loading[0]
    # every other line survives, in order
    plain = [render_line(line) for line in text.split("\n")]
    assert [p for p in plain if bar_state(p) is None] == [
        k for k in shown + [""] if bar_state(k) is None
    ]
    assert len(shown) < len(text.split("\n"))


def test_carriage_return_overwrites_like_a_terminal():
    assert render_line("(EngineCore pid=7) \rLoading: 50% Completed | 1/2 [00:01<00:01]") == (
        "Loading: 50% Completed | 1/2 [00:01<00:01]"
    )
    assert render_line("banner line\r") == "banner line"  # \r\n endings
    assert render_line("abcdef\rXY") == "XYcdef"
    assert (
        render_line("\x1b[36m(EngineCore pid=7)\x1b[0m ready\x1b[K") == "(EngineCore pid=7) ready"
    )


def test_successive_bar_lines_collapse_but_a_restarted_bar_stays_apart():
    text = (
        "Loading: 0% Completed | 0/2 [00:00<?, ?it/s]\n"
        "Loading: 50% Completed | 1/2 [00:01<00:01, 1.0it/s]\n"
        "Loading: 100% Completed | 2/2 [00:02<00:00, 1.0it/s]\n"
        "Loading: 0% Completed | 0/2 [00:00<?, ?it/s]\n"
        "Loading: 100% Completed | 2/2 [00:02<00:00, 1.0it/s]\n"
        "done\n"
    )
    assert collapse(text).splitlines() == [
        "Loading: 100% Completed | 2/2 [00:02<00:00, 1.0it/s]",
        "Loading: 100% Completed | 2/2 [00:02<00:00, 1.0it/s]",
        "done",
    ]


def test_stream_cut_anywhere_gives_the_same_lines():
    text = real_log()
    whole = collapse(text).splitlines()
    for size in (7, 100, 4096):
        lines = TerminalLines()
        out = []
        for i in range(0, len(text), size):
            out += lines.feed(text[i : i + size])
        out += lines.flush()
        assert out == whole, size


def test_a_bar_being_drawn_is_pending_and_replaced_by_its_next_state():
    lines = TerminalLines()
    assert (
        lines.feed("(EngineCore pid=7) \rCapturing CUDA graphs (FULL):   0%|  | 0/51 [00:00") == []
    )
    assert lines.pending() == ["Capturing CUDA graphs (FULL):   0%|  | 0/51 [00:00"]
    lines.feed("<?, ?it/s]\rCapturing CUDA graphs (FULL):  50%|█ | 25/51 [00:01<00:01, 25it/s]")
    assert lines.pending() == ["Capturing CUDA graphs (FULL):  50%|█ | 25/51 [00:01<00:01, 25it/s]"]
    done = lines.feed(
        "\rCapturing CUDA graphs (FULL): 100%|██| 51/51 [00:02<00:00, 25it/s]\nnext\n"
    )
    assert done == ["Capturing CUDA graphs (FULL): 100%|██| 51/51 [00:02<00:00, 25it/s]", "next"]
    assert lines.pending() == []


class LogRoute:
    """The control API's log route over a file that grows between reads (its JSON shape)."""

    def __init__(self, chunks: list[str]) -> None:
        self.chunks = chunks
        self.text = ""

    def logs(self, name, previous=False, offset=None, tail=None) -> LogChunk:
        if self.chunks:
            self.text += self.chunks.pop(0)
        start = offset or 0
        data = self.text[start:]
        # read as the client reads the route's answer
        return LogChunk.from_json(
            {
                "run": 1,
                "path": f"/home/logs/{name}/current.log",
                "start": start,
                "offset": len(self.text),
                "size": len(self.text),
                "text": data,
                "eof": True,
            }
        )


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_vsup_logs_prints_each_bar_once():
    text = real_log()
    route = LogRoute([text])
    out = io.StringIO()
    follow(cast(Client, route), "a", previous=False, keep=False, tail=None, out=out)
    assert out.getvalue() == collapse(text)
    raw = io.StringIO()
    follow(
        cast(Client, LogRoute([text])),
        "a",
        previous=False,
        keep=False,
        tail=None,
        out=raw,
        raw=True,
    )
    assert raw.getvalue() == text


def follow_until_quiet(chunks: list[str], out) -> str:
    """`vsup logs -f` over a log that grows by `chunks`, stopped (as by ^C) once it is quiet."""
    route = LogRoute(list(chunks))
    calls = 0
    read = route.logs

    def logs(*a, **k):
        nonlocal calls
        calls += 1
        if calls > len(chunks) + 1:
            raise KeyboardInterrupt
        return read(*a, **k)

    route.logs = logs  # type: ignore[method-assign]  # a spy around the real method
    with contextlib.suppress(KeyboardInterrupt):
        follow(cast(Client, route), "a", previous=False, keep=True, tail=None, out=out, interval=0)
    return out.getvalue()


def test_vsup_logs_follow_redraws_the_moving_bar_in_place_on_a_terminal():
    chunks = [
        "start\n(EngineCore pid=7) \rCapturing CUDA graphs (FULL):   0%|  | 0/4 [00:00<?, ?it/s]",
        "\rCapturing CUDA graphs (FULL):  50%|█ | 2/4 [00:01<00:01, 2it/s]",
        "\rCapturing CUDA graphs (FULL): 100%|██| 4/4 [00:02<00:00, 2it/s]\nready\n",
    ]
    written = follow_until_quiet(chunks, Tty())
    # each state drawn over the last (erase the line), the final one kept, then the next line
    assert written.count("\r\x1b[K") == 2
    assert "2/4" in written
    screen = written.split("\r\x1b[K")[-1]
    assert screen == "Capturing CUDA graphs (FULL): 100%|██| 4/4 [00:02<00:00, 2it/s]\nready\n"
    # into a pipe nothing moving is written, only finished lines
    assert follow_until_quiet(chunks, io.StringIO()) == (
        "start\nCapturing CUDA graphs (FULL): 100%|██| 4/4 [00:02<00:00, 2it/s]\nready\n"
    )
