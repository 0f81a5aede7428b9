"""Restore and adoption: what a starting daemon takes back from the last one.

The state file (and its backup) gives the layout and each instance's process; journal events
written after it bring it up to date (`replay`), and the journal's last `apply` gives the
layout back when both state files are bad. Live processes are adopted (pid + start time +
group); ones that vanished while no daemon watched exit through the restart policy, except
exits that recur (the engine's DETERMINISTIC reasons).

`restore(daemon)` runs once, before the control API answers; what it uses of the daemon is
`host.DaemonHost`, and each of its steps takes only the part of the daemon it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from vsup.clock import iso_utc
from vsup.control.host import DaemonHost
from vsup.control.journal import Journal, last_layout, replay
from vsup.control.state import DaemonState, InstanceRecord, spec_from_dict
from vsup.engine import AdoptRecord, Engine
from vsup.engine.restart import DETERMINISTIC  # exits that recur: not restarted when vanished
from vsup.engine.rollout import Rollout, RolloutState
from vsup.journalevents import AdoptEvent, RolloutEvent
from vsup.layout.compiled import LayoutSettings, compile_document, layout_settings
from vsup.layout.model import loads_layout
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import LastExit
from vsup.states import IDLE, State

log = logging.getLogger("vsup.daemon")

# How long a restarted daemon waits for adopted instances' first health check before serving.
ADOPT_SETTLE_S = 5.0
# A process recorded as started more than this before the node's boot time belongs to an
# earlier boot (start times are wall clock, and the boot time moves a little when NTP steps it).
BOOT_SLACK_S = 5.0


def boot_time() -> float | None:
    """When this node last booted (wall-clock seconds), or None when it cannot be read."""
    import psutil

    try:
        return float(psutil.boot_time())
    except (OSError, RuntimeError):
        return None


def before_boot(create_time: float | None, booted: float | None) -> bool:
    """Whether a recorded process started before the node last booted: after a reboot its pid
    and process group may name other processes, so it is neither adopted nor swept."""
    return create_time is not None and booted is not None and create_time < booted - BOOT_SLACK_S


async def restore(daemon: DaemonHost) -> None:
    """Bring back what the last daemon left: the layout, live instances (adopted), and
    instances that vanished meanwhile (their exit goes through the restart policy)."""
    state = _load_state(daemon)
    daemon.layout_path = state.layout_path
    daemon.layout_toml = state.layout_toml
    daemon.layout_name = state.layout_name
    if state.layout_toml:
        await _restore_layout(daemon, state.layout_toml, state.layout_path)
    booted = boot_time()
    vanished, rebooted = await _restore_instances(daemon, state, booted)
    _restore_router(daemon, state.router, booted)
    _restore_rollout(daemon, state)
    await _settle_adopted(daemon.engine)
    _alert_restart(daemon, vanished, rebooted)
    if daemon.metrics_listen:
        await daemon.start_metrics()
    daemon.state_changed()


def _load_state(daemon: DaemonHost) -> DaemonState:
    """The state file (or its backup), brought up to date by the journal events written after
    it; the journal's last `apply` gives the layout when it is newer or the state lost it."""
    result = daemon.state_file.load()
    if result.problem:
        daemon.report_problem("state_file", result.problem)
    state = result.state or DaemonState()
    _replay_journal(daemon.journal, state)
    applied = last_layout(daemon.journal.iter_file())
    if applied is not None and (applied.seq >= state.journal_seq or not state.layout_toml):
        # Applied after the state was written, or the state files lost it.
        state.layout_toml, state.layout_path = applied.toml, applied.path
        state.layout_name = applied.name
        if result.problem:
            log.info("the running layout comes back from journal event %d", applied.seq)
    return state


async def _restore_instances(
    daemon: DaemonHost, state: DaemonState, booted: float | None
) -> tuple[list[str], list[str]]:
    """Each recorded instance: started fresh when its run began before the node's boot,
    adopted when its process lives (restarted by the policy when it vanished), registered idle
    when it had no process. Returns the names that vanished and those rebooted."""
    vanished: list[str] = []
    rebooted: list[str] = []
    for name, rec in state.instances.items():
        try:
            spec = spec_from_dict(rec.spec)
        except ValueError as exc:
            daemon.report_problem("state_file", f"instance {name}: {exc}")
            continue
        if rec.pid is not None and before_boot(rec.create_time, booted):
            rebooted.append(name)
            await _start_fresh(daemon, name, spec, rec)
        elif rec.pid is not None and rec.create_time is not None and rec.pgid is not None:
            record = AdoptRecord(
                pid=rec.pid,
                create_time=rec.create_time,
                pgid=rec.pgid,
                port=rec.port or spec.port,
                run=rec.run,
                restarts=rec.restarts,
                descendants={int(p): t for p, t in rec.descendants.items()},
            )
            if not await _adopt(daemon, name, spec, record):
                vanished.append(name)
        else:
            _register_idle(daemon.engine, spec, rec)
    return vanished, rebooted


async def _start_fresh(
    daemon: DaemonHost, name: str, spec: InstanceSpec, rec: InstanceRecord
) -> None:
    """The node rebooted since this run began: nothing of it can be alive. It was meant to
    run, so it starts fresh (no crash counted; a reboot is no failure of it)."""
    daemon.journal.append(
        AdoptEvent(
            instance=name,
            adopted=False,
            pid=rec.pid,
            run=rec.run,
            why="its run began before the node last booted: started fresh",
        )
    )
    rec.state = "stopped"
    _register_idle(daemon.engine, spec, rec)
    await daemon.engine.start(name)


async def _adopt(daemon: DaemonHost, name: str, spec: InstanceSpec, record: AdoptRecord) -> bool:
    """Adopt the recorded process; False when it died while no daemon watched: an exit like
    any other (counted, and restarted unless the policy or the exit's reason says not)."""
    if daemon.engine.adopt(spec, record) is not None:
        log.info("re-adopted %s (pid %s, run %s)", name, record.pid, record.run)
        return True
    gone = daemon.engine.instances[name]
    reason = gone.last_exit.reason if gone.last_exit else "unknown"
    daemon.note_failure(name)
    log.warning("%s: pid %s vanished while no daemon ran (%s)", name, record.pid, reason)
    if spec.restart.policy != "never" and reason not in DETERMINISTIC:
        await daemon.engine.start(name, automatic=True)
    return False


def _restore_rollout(daemon: DaemonHost, state: DaemonState) -> None:
    """The latest rolling apply: from the state file, or from the journal's `rollout` events
    written after it. One still `running` had its daemon killed under it: it is
    `interrupted` now (journaled), and status says which instances keep their old spec."""
    doc = state.rollout
    after = state.journal_seq - 1 if state.journal_seq else 0
    for ev in daemon.journal.iter_file():
        seq = ev.get("seq")
        if (
            ev.get("kind") == "rollout"
            and isinstance(seq, int)
            and seq > after
            and isinstance(ev.get("names"), list)
            and isinstance(ev.get("restarted"), list)
        ):
            doc = {**ev, "done": ev["restarted"]}
    if not doc:
        return
    try:
        rollout = Rollout.from_record(doc)
    except ValueError as exc:
        daemon.report_problem("state_file", str(exc))
        return
    daemon.engine.rollout = rollout
    if rollout.state in (RolloutState.RUNNING, RolloutState.CANCELLED):
        rollout.interrupted(iso_utc(daemon.clock.wall()))
        outdated = [i.name for i in daemon.snapshot().instances if i.lifecycle.outdated]
        daemon.journal.append(RolloutEvent.of({**rollout.to_json(), "old_config": outdated}))
        log.warning(
            "a rolling apply was interrupted (its daemon ended at wave %d/%d); "
            "instances on their old spec: %s",
            rollout.wave,
            len(rollout.waves),
            ", ".join(outdated) or "none",
        )


async def _restore_layout(daemon: DaemonHost, toml: str, path: str | None) -> None:
    """The running layout compiled again on this node, for its alerts and metrics listener.
    One that no longer compiles (a stricter vsup, a GPU gone, a profile removed) is a problem
    the operator sees; its alerts and listener still work where its tables can be read."""
    layout = loads_layout(toml, path)
    compiled, diagnostics = await asyncio.to_thread(compile_document, layout, daemon.node_facts)
    daemon.layout = compiled
    if compiled is not None:
        settings = compiled.settings
        daemon.set_layout_specs(compiled.specs)
    else:
        errors = [d for d in diagnostics if d.is_error]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        daemon.report_problem(
            "layout",
            f"the running layout {daemon.layout_name or layout.name} no longer validates on this "
            f"node: {errors[0].format() if errors else 'unreadable'}{more}; it keeps running as "
            "it is, and `vsup up` of a layout that validates replaces it",
        )
        try:
            settings = layout_settings(layout)
        except (TypeError, ValueError):
            settings = LayoutSettings()
    daemon.metrics_listen = settings.metrics_listen
    daemon.alerts.configure(settings.alerts)


def _restore_router(
    daemon: DaemonHost, doc: dict[str, Any] | None, booted: float | None = None
) -> None:
    """The router the last daemon ran: adopted when it still runs, else started again (unless
    its policy is `never` or it was stopped on purpose); after a reboot, started fresh."""
    if not doc:
        return
    from vsup.router import RouterSpec

    try:
        spec = RouterSpec.from_json(doc.get("spec") or {})
        record = AdoptRecord.from_json(doc["process"]) if doc.get("process") else None
    except (KeyError, TypeError, ValueError) as exc:
        daemon.report_problem("state_file", f"router: {exc}")
        return
    router = daemon.engine.router
    # this daemon's holders (wake on request) listen elsewhere: the old ones are vsup's own
    router.retired.update(str(u) for u in doc.get("holders") or ())
    if record is not None and before_boot(record.create_time, booted):
        router.register(spec, run=record.run, restarts=record.restarts)
        daemon.journal.append(
            AdoptEvent(
                router=spec.port,
                adopted=False,
                pid=record.pid,
                run=record.run,
                why="its run began before the node last booted: started fresh",
            )
        )
        daemon.spawn(router.start(), "router start")
        return
    if record is not None and router.adopt(spec, record):
        log.info("re-adopted the router (pid %s, run %s)", record.pid, record.run)
        return
    if record is None:
        router.register(spec, run=int(doc.get("run") or 0), restarts=int(doc.get("restarts") or 0))
    if doc.get("state") not in IDLE and spec.restart.policy != "never":
        daemon.spawn(router.start(automatic=True), "router start")


def _alert_restart(
    daemon: DaemonHost, vanished: list[str], rebooted: list[str] | None = None
) -> None:
    """`daemon_restarted`: this daemon took over instances a previous one left (or, after a
    reboot, started again the ones that were running)."""
    adopted = [n for n, i in daemon.engine.instances.items() if getattr(i, "adopted", False)]
    if not adopted and not vanished and not rebooted:
        return
    parts = []
    if rebooted:
        parts.append(
            f"the node rebooted: started {len(rebooted)} instance(s) again ({', '.join(rebooted)})"
        )
    if adopted:
        parts.append(f"re-adopted {len(adopted)} running instance(s) ({', '.join(adopted)})")
    if vanished:
        parts.append(f"{len(vanished)} had exited meanwhile ({', '.join(vanished)})")
    daemon.alerts.notify(
        "daemon_restarted",
        f"vsup daemon restarted on {daemon.node.hostname} (pid {os.getpid()}): "
        + "; ".join(parts)
        + ". See daemon.log in VSUP_HOME for why the previous one ended.",
    )


async def _settle_adopted(engine: Engine) -> None:
    """Give adopted instances one health check (and sleep-mode ones their server's word on
    their sleep) before the API answers, so that the first status after a daemon restart says
    `ready` for servers that are, and `asleep` for sleepers (bounded wait; until then a
    sleeper's sleep state is `unknown`, never `awake`)."""
    adopted = [n for n, i in engine.instances.items() if getattr(i, "adopted", False)]
    if not adopted:
        return
    settled = (State.READY, State.UNHEALTHY, State.BACKOFF, State.FAILED, State.STOPPED)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(
                *(engine.wait(n, settled) for n in adopted),
                *(engine.sleeper.told(n) for n in adopted),
            ),
            ADOPT_SETTLE_S,
        )


def _replay_journal(journal: Journal, state: DaemonState) -> None:
    """Bring `state` up to date with journal events written after it (a daemon killed
    between an event and the next state write, or a state file restored from its backup)."""
    after = state.journal_seq - 1 if state.journal_seq else 0
    if state.written_at is None and state.instances:
        after = 0
    for name, rep in replay(journal.iter_file(), after_seq=after).items():
        rec = state.instances.get(name)
        if rec is None:
            if rep.spec is None:
                continue
            rec = state.instances[name] = InstanceRecord(name=name, spec=rep.spec)
        if rep.spec is not None:
            rec.spec = rep.spec
        if rep.running and rep.pid:
            rec.pid, rec.pgid, rec.create_time = rep.pid, rep.pgid, rep.create_time
            rec.port = rep.port or rec.port
            rec.run = max(rec.run, rep.run)
            rec.descendants = {}
            rec.state = State.STARTING
        elif not rep.running and rep.last_exit is not None:
            rec.pid = rec.pgid = rec.create_time = None
            rec.last_exit = rep.last_exit
            rec.state = State.STOPPED
        rec.restarts = max(rec.restarts, rep.restarts)


def _register_idle(engine: Engine, spec: InstanceSpec, rec: InstanceRecord) -> None:
    """An instance with no process (stopped or failed): known again, not started, with
    its run number, restarts and last exit as they were."""
    engine.restore(
        spec,
        state=State.FAILED if rec.state == State.FAILED else State.STOPPED,
        run=rec.run,
        restarts=rec.restarts,
        last_exit=_last_exit(rec.last_exit),
        failed_why=rec.failed_why,
    )


def _last_exit(value: Any) -> LastExit | None:
    if not isinstance(value, dict):
        return None
    return LastExit(
        code=value.get("code"),
        signal=value.get("signal"),
        reason=value.get("reason") or "unknown",
        at=value.get("at") or "",
        log_excerpt=value.get("log_excerpt"),
    )
