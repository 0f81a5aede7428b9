"""A pull's bytes, rates and ETAs, fed the way huggingface_hub drives a progress bar."""

from __future__ import annotations

import pytest

from vsup.pull.errors import PullCancelled
from vsup.pull.progress import PullProgress
from vsup.pull.selection import RepoFile

from tests.support.clock import FakeClock

MiB = 2**20


def test_rates_and_etas_per_file_and_in_total():
    clock = FakeClock()
    files = [RepoFile("config.json", 100), RepoFile("a.safetensors", 100 * MiB)]
    prog = PullProgress(files, cached=["config.json"], clock=clock.monotonic)
    prog.started("a.safetensors")
    bar = prog.bar_class("a.safetensors")(total=100 * MiB, initial=0, desc="a.safetensors")
    for _ in range(4):
        clock.advance(1.0)
        bar.update(10 * MiB)
    rep = prog.report()
    (a,) = rep.fetching
    assert a.done == 40 * MiB and a.rate_bps == pytest.approx(10 * MiB)
    assert a.eta_s == pytest.approx(6.0)
    assert rep.bytes_done == 40 * MiB + 100 and rep.bytes_total == 100 * MiB + 100
    assert rep.fetched_bytes == 40 * MiB  # the cached config came over no network
    assert rep.files_done == 1 and rep.files_total == 2
    # a server that ignored the Range request: the file starts over (huggingface_hub undoes it)
    bar.update(-40 * MiB)
    assert prog.report().fetching[0].done == 0
    prog.finished("a.safetensors")
    rep = prog.report()
    assert rep.files_done == 2 and rep.eta_s == 0.0 and rep.to_json()["files_total"] == 2


def test_a_cancelled_pull_stops_at_the_next_chunk():
    prog = PullProgress([RepoFile("a.safetensors", 10)])
    bar = prog.bar_class("a.safetensors")(total=10)
    bar.update(1)
    prog.cancel.set()
    with pytest.raises(PullCancelled):
        bar.update(1)
