"""`vsup up`'s plan, consent and rollout lines, without a daemon (the CLI test runs one)."""

from __future__ import annotations

import io
from typing import cast

import pytest

from vsup.answers import ApplyPlan
from vsup.commands import up
from vsup.commands.cliutil import CommandFailed
from vsup.control.client import Client
from vsup.snapshot import StatusSnapshot


def rollout(state="running", wave=1, current=("a",), done=0, failure=None):
    return {
        "state": state,
        "wave": wave,
        "waves": 3,
        "done": done,
        "total": 3,
        "current": list(current),
        "failure": failure,
    }


class Statuses:
    """A client whose status() answers the given rollouts in turn (then the last)."""

    def __init__(self, *rollouts):
        self.rollouts = list(rollouts)

    def status(self):
        r = self.rollouts.pop(0) if len(self.rollouts) > 1 else self.rollouts[0]
        return StatusSnapshot.from_json(
            {
                "schema": 1,
                "supervisor": {"pid": 1, "version": "0", "uptime_s": 1.0},
                "node": {"hostname": "n", "gpu_vendor": "none", "gpu_count": 0},
                "instances": [],
                "rollout": r,
            }
        )


def test_the_plan_marks_serving_instances_and_says_which_restarts_roll(capsys):
    plan = ApplyPlan(
        start=("n",), restart=("a", "b"), rolling=("a",), stop=("c",), unchanged=("d",)
    )
    up.print_plan(plan, serving={"a", "c", "d"})
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "start: n",
        "restart (changed, rolling): a",
        "restart (changed, at once): b",
        "stop (removed): c (serving)",
        "unchanged: d",
    ]
    assert up.interrupted(plan, {"a", "c", "d"}) == ["c", "a"]


def test_without_a_terminal_consent_is_refused_with_exit_3(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CommandFailed) as err:
        up.confirm(["b0", "b1"])
    assert err.value.code == up.EXIT_NOT_CONFIRMED == 3
    assert "(b0, b1)" in str(err.value) and "--yes" in str(err.value)


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(
    "answer, ok", [("y\n", True), ("yes\n", True), ("\n", False), ("n\n", False)]
)
def test_on_a_terminal_only_yes_proceeds(monkeypatch, answer, ok):
    monkeypatch.setattr("sys.stdin", Tty(answer))
    if ok:
        up.confirm(["b0"])
    else:
        with pytest.raises(CommandFailed) as err:
            up.confirm(["b0"])
        assert err.value.code == 3 and "nothing was changed" in str(err.value)


def test_following_a_rollout_prints_each_wave_once_and_its_end(capsys):
    client = Statuses(
        rollout(wave=1, current=("a",)),
        rollout(wave=1, current=("a",)),
        rollout(wave=2, current=("b",), done=1),
        rollout(state="done", wave=3, current=(), done=3),
    )
    assert up.follow_rollout(cast(Client, client), timeout=60, sleep=lambda s: None) == 0
    assert capsys.readouterr().out.splitlines() == [
        "rollout wave 1/3: restarting a (0/3 done)",
        "rollout wave 2/3: restarting b (1/3 done)",
        "rollout done (3/3 restarted)",
    ]


def test_a_failed_rollout_says_why_and_exits_1(capsys):
    why = "wave 2/3 failed: b is failed (oom); c keep their old config and keep serving"
    client = Statuses(rollout(state="failed", wave=2, current=("b",), done=1, failure=why))
    assert up.follow_rollout(cast(Client, client), timeout=60, sleep=lambda s: None) == 1
    assert capsys.readouterr().out.strip() == f"rollout failed: {why}"


def test_a_rollout_that_outlasts_the_timeout_exits_1(capsys):
    t = iter(range(0, 1000, 10))
    client = Statuses(rollout())
    code = up.follow_rollout(
        cast(Client, client), timeout=25, clock=lambda: next(t), sleep=lambda s: None
    )
    assert code == 1 and "did not end within 25 s" in capsys.readouterr().err
