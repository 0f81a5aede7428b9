"""A span follower's view of its head (docs/fleet.md, "Watched as one").

A follower runs ranks headless: no API server, nothing of its own to ask. What it serves is
its head's: its health is the head's `/health` (`InstanceSpec.client_host`), and the runner
follows it with two rules, kept here as pure decisions so that they are tested without vLLM:

- **Ready only behind a head that started after it.** vLLM's head answers `/health` only once
  every rank joined it (it waits for the DP coordinator's READY first), so a new head is always
  preceded by a time it does not answer. A follower that starts while an old head still answers
  200 (the head lies: one of its ranks is gone and its requests hang, ../shared/VLLM-FACTS.md)
  has not joined that head: it is not ready until it has seen the head not answer and then
  answer again.
- **The head going away restarts the follower.** A ready follower whose head stops answering
  (`unhealthy_after` checks in a row; a head that gives no answer at all for
  `unhealthy_grace_s`, as for any instance: a busy head is not a gone one) is ended and started
  again by the restart policy, so that it joins the head's next run: a follower's engine joins
  a head once, at its start. That is `Lifecycle.health_failed`, with the words of `gone_why`.

Together with the head's own watch (a probe per rank, `layout/span.py`), any member's death
restarts the head, the head's restart restarts the followers, and the unit serves again.
"""

from __future__ import annotations

from dataclasses import dataclass

from vsup.layout.spec import SpanRole


@dataclass
class HeadWatch:
    """One follower run's view of its head while it starts. `trusted`: the run was adopted
    from an earlier daemon (it joined whatever head answers now)."""

    trusted: bool = False
    seen_down: bool = False  # the head did not answer 200 at least once since this run began

    def ready(self, head_ok: bool) -> bool:
        """Whether this answer of the head's `/health` makes the starting follower ready."""
        if not head_ok:
            self.seen_down = True
            return False
        return self.trusted or self.seen_down


def waiting_words(role: SpanRole, head_ok: bool) -> str:
    """What a starting follower waits for (its `wait`, kind `span_head`; said after "waits
    for"): the head to answer, or, while an older head still answers, the head's next run."""
    if not head_ok:
        return (
            f"{head_where(role)}: no answer on /health yet (a head answers once every rank "
            "joined it)"
        )
    return (
        f"{head_where(role)} to start again: the head that answers started before this "
        "follower, and a follower joins a head only at its start"
    )


def head_where(role: SpanRole) -> str:
    return f"its head {role.head_node} at {role.address}:{role.port}"


def gone_why(role: SpanRole, status: int | None) -> str:
    """Why a follower is ended when its head stopped answering."""
    said = f"said {status}" if status is not None else "did not answer"
    return (
        f"{head_where(role)} {said} on /health: the head is gone or restarting, and a follower "
        "joins a head only at its start; restarting to join the head's next run"
    )
