"""`vsup up` over the typed answers of a client that stands in for the daemon's socket: a pull
that fails ends the command with exit 1 and no dashboard; the plan printed is the answer's."""

from __future__ import annotations

import argparse

from vsup.answers import ApplyAnswer, decode
from vsup.commands import cliutil, up
from vsup.commands.exits import FAILED
from vsup.snapshot import StatusSnapshot

from tests.unit.control.helpers import emulator_layout

PULL = {"model": "org/m", "revision": "main", "cache_dir": "/c", "instances": ["a"]}


class PullFails:
    """Answers a plan that pulls org/m first; the status then shows that pull failed."""

    def __enter__(self) -> PullFails:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def apply(self, toml, path=None, dry_run=False, all_at_once=False, pull=True) -> ApplyAnswer:
        plan = {"start": ["a"], "pull": [PULL], "changes": {}}
        doc = {"plan": plan, "errors": [], "warnings": [], "applied": not dry_run}
        return decode(ApplyAnswer, doc, "POST /v1/apply")

    def status(self) -> StatusSnapshot:
        failed = {**PULL, "state": "failed", "reason": "not_found", "message": "no such repo"}
        return StatusSnapshot.from_json(
            {
                "schema": 1,
                "supervisor": {"pid": 1, "version": "0", "uptime_s": 1.0},
                "node": {"hostname": "n", "gpu_vendor": "none", "gpu_count": 0},
                "instances": [],
                "pulls": [failed],
            }
        )


def test_a_failed_pull_exits_1_without_opening_the_dashboard(tmp_path, monkeypatch, capsys):
    layout = tmp_path / "fakes.toml"
    layout.write_text(emulator_layout({"a": 18001}))
    monkeypatch.setattr(cliutil, "client_for_cli", lambda start=True: PullFails())
    opened = []
    monkeypatch.setattr(up, "open_dashboard", lambda: opened.append(1) or 0)  # type: ignore[func-returns-value]  # a spy: records the call, returns 0
    args = argparse.Namespace(
        layout=str(layout),
        detach=False,
        wait=False,
        timeout=30.0,
        yes=True,
        dry_run=False,
        no_pull=False,
        all_at_once=False,
    )
    assert up._up(args) == FAILED
    assert opened == []
    out, err = capsys.readouterr()
    assert "pull first: org/m into /c (for a; nothing starts until it is there)" in out
    assert "the pull of org/m failed (not_found): no such repo; a not started" in err
