"""What `vsup up --wait`, `vsup status`, the advice and the journal say of a canary (docs/canary.md)."""

from __future__ import annotations

from typing import cast

from vsup.commands import up
from vsup.commands.status import rollout_lines
from vsup.control.alerts import ADVICE_KINDS
from vsup.control.client import Client
from vsup.control.daemon import rollout_advice
from vsup.journalevents import CanaryEvent, RolloutEvent, decode
from vsup.snapshot import RolloutStatus

from tests.unit.commands.test_up_plan_output import Statuses, rollout

WHY = (
    "canary r0: p99 TTFT 2.9x the others (812 ms vs 281 ms over 60 s, 412 vs 1,630 requests); "
    "rolled back"
)


def rolled_back() -> RolloutStatus:
    return RolloutStatus(
        state="rolled_back",
        wave=1,
        waves=2,
        done=0,
        total=2,
        failure=WHY,
        names=("r0", "r1"),
        old_config=("r0", "r1"),
        canary=("r0",),
        canary_s=60,
        canary_state="failed",
    )


def test_up_wait_follows_the_watch_and_exits_1_on_a_rollback(capsys):
    watching = {**rollout(wave=1, current=()), "canary": ["a"], "canary_s": 30.0}
    watching["canary_state"] = "watching"
    client = Statuses(
        rollout(wave=1, current=("a",)), watching, rollout(state="rolled_back", failure=WHY)
    )
    assert up.follow_rollout(cast(Client, client), timeout=60, sleep=lambda s: None) == 1
    assert capsys.readouterr().out.splitlines() == [
        "rollout wave 1/3: restarting a (0/3 done)",
        "rollout wave 1/3: watching canary a for 30 s (0/3 done)",
        f"rollout rolled back: {WHY}",
    ]


def test_status_says_the_watch_and_the_rollback_in_words():
    watching = RolloutStatus(
        state="running",
        wave=1,
        waves=2,
        done=0,
        total=2,
        current=(),
        pending=("r1",),
        canary=("r0",),
        canary_s=60,
        canary_state="watching",
    )
    (line,) = rollout_lines(watching)
    assert line == (
        "ROLLOUT wave 1/2: watching canary r0 for 60 s beside r1 (old config) · "
        "`vsup rollout promote|abort`"
    )
    assert rollout_lines(rolled_back()) == [
        f"ROLLOUT ROLLED BACK at its canary: {WHY}",
        "  on the old config: r0, r1",
    ]


def test_the_advice_and_its_alert_kind():
    (advice,) = rollout_advice(rolled_back())
    assert advice.kind == "canary_rolled_back" and advice.severity == "warning"
    assert advice.message.startswith(WHY) and "`vsup events`" in advice.message
    assert ADVICE_KINDS["canary_rolled_back"] == "canary_rolled_back"


def test_the_journal_says_the_verdict_in_words():
    ev = CanaryEvent(
        instances=["r0"],
        decision="fail",
        reason=WHY.removesuffix("; rolled back"),
        action="roll_back",
        watched_s=60.0,
        figures={"p99_ttft_ms": [812.0, 281.0]},
    )
    back = decode(ev.to_json())
    assert back == ev and back.describe() == WHY
    done = RolloutEvent.of({"state": "rolled_back", "failure": WHY, "wave": 1, "waves": 2})
    assert done.describe() == f"rollout rolled back at its canary: {WHY}"
