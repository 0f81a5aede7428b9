"""The control service: what each control API route asks of the daemon (`api.ControlService`).

Requests are checked by `api.py`; this part does the work on the daemon's engine, journal and
monitor. `DaemonService` is `Daemon.service`; what it uses of the daemon is `host.DaemonHost`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Any

from vsup import __version__, paths
from vsup.control.api import LogFile
from vsup.control.errors import Conflict, ControlError, UnknownInstances
from vsup.control.host import DaemonHost
from vsup.control.layouthistory import (
    KeptLayout,
    LayoutHistory,
    bench_candidate,
    journal_applies,
)
from vsup.control.state import spec_to_dict
from vsup.engine import Engine, Instance
from vsup.engine.routing import ROUTER_NAME
from vsup.engine.sleep import SleepRefused
from vsup.journalevents import ActionEvent
from vsup.layout.changes import spec_changes
from vsup.layout.compiled import CompiledLayout, compile_layout
from vsup.layout.diagnostics import LayoutError
from vsup.layout.secrets import SECRET_NAME
from vsup.layout.spec import InstanceSpec
from vsup.layout.store import Saved, save_layout
from vsup.pull.targets import Resolution
from vsup.states import State

log = logging.getLogger(__name__)


class DaemonService:
    """`api.ControlService` over a daemon: what each route does."""

    def __init__(self, daemon: DaemonHost) -> None:
        self.daemon = daemon
        # the last applied layouts (`vsup rollback`); a home without the file: the journal's
        self.kept_layouts = LayoutHistory(
            paths.layouts_path(daemon.home), lambda: journal_applies(daemon.journal.iter_file())
        )

    def instance_names(self) -> list[str]:
        return list(self.daemon.engine.instances)

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": __version__, "home": str(self.daemon.home)}

    def status(self) -> dict[str, Any]:
        # someone reads the figures: every instance is scraped every poll for a while
        # (control/monitor.py, "Nobody watching")
        self.daemon.monitor.read()
        # the snapshot as it is: nothing is patched on (snapshot.py is the whole document)
        return self.daemon.snapshot().to_json()

    def bench_progress(self, report: dict[str, Any]) -> dict[str, Any]:
        self.daemon.bench.update(report)
        return {"bench": self.daemon.bench.current()}

    def layout(self) -> dict[str, Any]:
        return {
            "path": self.daemon.layout_path,
            "toml": self.daemon.layout_toml,
            "name": self.daemon.layout_name,
        }

    async def layouts(self) -> dict[str, Any]:
        """`GET /v1/layouts`: the kept layouts, newest first, and the running layout's text."""
        kept = await asyncio.to_thread(self.kept_layouts.entries)
        return {
            "layouts": [k.to_json() for k in reversed(kept)],
            "running": self.daemon.layout_toml,
        }

    async def apply(
        self,
        toml: str,
        path: str | None,
        dry_run: bool,
        all_at_once: bool = False,
        pull: bool = True,
        rollback_of: int | None = None,
    ) -> dict[str, Any]:
        """`rollback_of`: `vsup rollback` applies the kept layout of this seq (the journal's
        apply event says so)."""
        if self.daemon.shutting_down:
            raise Conflict("the daemon is shutting down (vsup down); run `vsup up` afterwards")
        # One apply at a time from compile to the engine's hand-off: the layout that is
        # journaled and recorded as running is the one the engine was given, and a dry run
        # compares with what the last apply left (issue 31: interleaved applies lost a restart).
        async with self.daemon.apply_lock:
            if self.daemon.shutting_down:
                raise Conflict("the daemon is shutting down (vsup down); run `vsup up` afterwards")
            compiled, diags = await asyncio.to_thread(
                compile_layout, toml, path, self.daemon.node_facts
            )
            warnings = [d.to_json() for d in diags if not d.is_error]
            if compiled is None:
                return _refused([d.to_json() for d in diags if d.is_error], warnings)
            # hub models (docs/pull.md): those complete in the cache start from their snapshot
            # offline; the others are pulled first, unless `pull` is false (`--no-pull`)
            resolution = await asyncio.to_thread(self.daemon.pulls.resolve, compiled.specs, pull)
            compiled = dataclasses.replace(compiled, specs=resolution.specs)
            rolling = not all_at_once
            plan = self._plan(compiled, rolling)
            plan["pull"] = [t.to_json() for t in resolution.pulls]  # additive: pulled first
            if dry_run:
                return {"plan": plan, "errors": [], "warnings": warnings, "applied": False}
            rollback = None if rollback_of is None else await self._rollback_of(rollback_of)
            applied = self._record(compiled, plan, rollback)
            await asyncio.to_thread(self._keep, applied)
            self.daemon.alerts.configure(compiled.alerts)
            warnings += await self._listen(compiled.metrics_listen)
            if resolution.pulls:
                self._after_pulls(compiled, resolution, rolling)
                return {"plan": plan, "errors": [], "warnings": warnings, "applied": True}
            self.daemon.pulls.supersede()
            handed = await self._hand_off(compiled, rolling)
        self.daemon.state_changed()
        done: dict[str, Any] = {**handed, "changes": plan["changes"], "pull": []}
        return {"plan": done, "errors": [], "warnings": warnings, "applied": True}

    async def _rollback_of(self, seq: int) -> tuple[int, str | None]:
        """The kept layout a rollback re-applies: its seq and when it was applied (None when
        it is no longer kept: the client's word is journaled as it came)."""
        kept = await asyncio.to_thread(self.kept_layouts.entries)
        return seq, next((k.t for k in kept if k.seq == seq), None)

    def _keep(self, applied: KeptLayout) -> None:
        """Keep the layout for `vsup rollback`, unless a bench applies it (a candidate). Never
        fails the apply: the journal has the layout whatever happens here."""
        try:
            if not bench_candidate(self.daemon.home, applied.toml):
                self.kept_layouts.record(applied)
        except Exception:
            log.exception("could not keep layout %s for vsup rollback", applied.seq)

    async def _hand_off(self, compiled: CompiledLayout, rolling: bool) -> dict[str, Any]:
        """The router, then the engine (the caller holds `apply_lock`): the engine's plan and
        the router's action. Returns once every start is under way (stops of removed
        instances continue)."""
        # what each instance should run from now on: status compares it (`outdated`)
        self.daemon.set_layout_specs(compiled.specs)
        # The router first: its members follow as the instances become ready.
        router_action = await self.daemon.engine.router.apply(compiled.router)
        applied = await self.daemon.engine.apply(
            compiled.specs,
            rolling=rolling,
            max_unavailable=compiled.rollout.max_unavailable,
            drain_timeout_s=compiled.rollout.drain_timeout_s,
            canary=compiled.rollout.canary,
        )
        return {**applied.to_json(), "router": router_action}

    def _after_pulls(self, compiled: CompiledLayout, resolution: Resolution, rolling: bool) -> None:
        """The apply waits for its pulls (control/pulls.py): instances new to the daemon show
        meanwhile as `stopped` rows carrying their pull; the rest keeps running as it is. Once
        the pulls are done the layout is handed off with every instance started from its
        snapshot - unless a newer apply (or `vsup down`) came first."""
        engine = self.daemon.engine
        waiting = set(resolution.waiting)
        for spec in compiled.specs:
            if spec.name in waiting and spec.name not in engine.instances:
                engine.restore(spec)
        self.daemon.state_changed()
        pulls = self.daemon.pulls
        generation = 0

        async def then(specs: list[InstanceSpec]) -> None:
            async with self.daemon.apply_lock:
                if self.daemon.shutting_down or not pulls.is_current(generation):
                    return
                await self._hand_off(dataclasses.replace(compiled, specs=tuple(specs)), rolling)
            self.daemon.state_changed()

        generation = pulls.begin(resolution, then)

    def _plan(self, compiled: CompiledLayout, rolling: bool) -> dict[str, Any]:
        """What applying `compiled` would do now: the engine's plan, the router's action
        (additive: start|restart|update|stop|unchanged) and, per instance whose spec changes,
        the keys that do (additive: `changes`, old -> new, secrets masked)."""
        engine = self.daemon.engine
        plan: dict[str, Any] = engine.diff(compiled.specs, rolling=rolling).to_json()
        plan["router"] = engine.router.diff(compiled.router)
        changes: dict[str, list[dict[str, Any]]] = {}
        for spec in compiled.specs:
            inst = engine.instances.get(spec.name)
            if inst is None:
                continue
            # against what its process runs (or ran last): what the operator would see change
            found = spec_changes(inst.spec, spec)
            if found:
                changes[spec.name] = [c.to_json() for c in found]
        plan["changes"] = changes
        return plan

    def _record(
        self,
        compiled: CompiledLayout,
        plan: dict[str, Any],
        rollback: tuple[int, str | None] | None = None,
    ) -> KeptLayout:
        """`compiled` is the running layout from now on: the daemon's record, the journal
        (returned as the layout to keep for `vsup rollback`). `rollback`: the kept layout's
        seq and time when `vsup rollback` applies it."""
        daemon = self.daemon
        daemon.layout = compiled
        daemon.layout_toml, daemon.layout_path = compiled.text, compiled.path
        daemon.layout_name = compiled.name
        # a layout restored from the state file that did not compile is replaced
        daemon.problems = [p for p in daemon.problems if p.kind != "layout"]
        # The layout's text rides with the event: a daemon that finds both state files bad
        # takes the running layout back from the journal (`last_layout`).
        event = daemon.journal.append(
            ActionEvent(
                action="apply",
                layout=compiled.name,
                path=compiled.path,
                plan=plan,
                toml=compiled.text,
                rollback_of=None if rollback is None else rollback[0],
                rollback_t=None if rollback is None else rollback[1],
            )
        )
        daemon.state_changed()
        seq = event.seq if event.seq is not None else daemon.journal.next_seq - 1
        return KeptLayout(
            seq=seq, toml=compiled.text, t=event.t, name=compiled.name, path=compiled.path
        )

    async def _listen(self, listen: tuple[str, int] | None) -> list[dict[str, Any]]:
        """Serve Prometheus metrics where the layout says (or stop); warnings when it cannot."""
        self.daemon.metrics_listen = listen
        if listen is None:
            await self.daemon.metrics.stop()
            return []
        if await self.daemon.start_metrics():
            return []
        message = self.daemon.problems[-1].message
        return [{"severity": "warning", "message": message, "text": message}]

    async def action(self, action: str, names: list[str], wait: bool) -> dict[str, Any]:
        if self.daemon.shutting_down:
            raise Conflict("the daemon is shutting down (vsup down)")
        router = self.daemon.engine.router
        if ROUTER_NAME in names and router.inst is None:
            raise ControlError("the running layout has no [router]", status=404)
        self.daemon.journal.append(ActionEvent(action=action, names=names, by="operator"))

        async def one(name: str) -> None:
            if name == ROUTER_NAME:
                # `vsup start|stop|restart @router`: the router's own supervisor
                await {"start": router.start, "stop": router.stop, "restart": router.restart}[
                    action
                ]()
            elif action == "start":
                await self.daemon.engine.start(name)
            elif action == "stop":
                await self.daemon.engine.stop(name)
            elif action == "drain":
                await self.daemon.engine.stop(name, drain=True)
            elif action == "restart":
                await self.daemon.engine.restart(name)
            self.daemon.state_changed()

        tasks = {name: self.daemon.spawn(one(name), f"{action} {name}") for name in names}
        if not wait:
            return {"done": [], "pending": names, "errors": []}
        # Shielded: a client that hangs up does not cancel a stop half-way.
        await asyncio.wait([asyncio.shield(t) for t in tasks.values()])
        done, errors = [], []
        for name, task in tasks.items():
            exc = task.exception()
            if exc is None:
                done.append(name)
            else:
                errors.append({"name": name, "error": str(exc) or type(exc).__name__})
        return {"done": done, "errors": errors}

    async def sleep_action(
        self, action: str, names: list[str], level: int | None, wait: bool
    ) -> dict[str, Any]:
        """`sleep NAME [level]`, `wake NAME`, `swap A B` (docs/sleep.md); the answer's
        `errors` says why one was refused or failed."""
        if self.daemon.shutting_down:
            raise Conflict("the daemon is shutting down (vsup down)")
        sleeper = self.daemon.engine.sleeper
        self.daemon.journal.append(
            ActionEvent(action=action, names=names, by="operator", level=level)
        )

        async def one() -> dict[str, Any]:
            try:
                if action == "sleep":
                    return await sleeper.sleep(names[0], level)
                if action == "wake":
                    return await sleeper.wake(names[0])
                return await sleeper.swap(names[0], names[1])
            finally:
                self.daemon.state_changed()

        task = self.daemon.spawn(one(), f"{action} {' '.join(names)}")
        if not wait:
            return {"done": [], "pending": names, "errors": []}
        # Shielded: a client that hangs up does not cancel a sleep half-way.
        await asyncio.wait([asyncio.shield(task)])
        exc = task.exception()
        if exc is None:
            return {"done": names, "errors": [], "result": task.result()}
        if not isinstance(exc, SleepRefused):
            log.error("%s %s failed", action, names, exc_info=exc)
        error = str(exc) or type(exc).__name__
        return {"done": [], "errors": [{"name": names[-1], "error": error}]}

    def log_file(self, name: str, previous: bool) -> LogFile:
        inst = _instance(self.daemon.engine, name)
        if previous:
            path = inst.previous_log_path
            run = inst.run - 1 if path is not None else None
        else:
            run = inst.run or None
            path = inst.log_path() if run else None
        if path is not None and not Path(path).exists():
            path = None
        return LogFile(run=run, path=Path(path) if path else None)

    def router_log_file(self, previous: bool) -> LogFile:
        """The router's run log (`GET /v1/router/logs`); 404 when the layout has none."""
        inst = self.daemon.engine.router.inst
        if inst is None:
            raise ControlError("the running layout has no [router]", status=404)
        if previous:
            path, run = inst.previous_log_path, inst.run - 1
        else:
            path, run = inst.log_path(), inst.run
        if path is None or not Path(path).exists():
            return LogFile(run=None, path=None)
        return LogFile(run=run, path=Path(path))

    def config(self, name: str) -> dict[str, Any]:
        inst = _instance(self.daemon.engine, name)
        spec = inst.spec
        env = spec.child_env({})
        if spec.api_key_env:
            where = "" if os.environ.get(spec.api_key_env) else ", which is not set"
            env["VLLM_API_KEY"] = f"*** (from ${spec.api_key_env}{where})"
        masked = {
            k: ("***" if SECRET_NAME.search(k) and not v.startswith("***") else v)
            for k, v in env.items()
        }
        cache = self.daemon.monitor.cache_config(name)
        return {
            "argv": spec.argv(),
            "env": masked,
            "cache_config": dict(cache) if cache else None,
            "spec": spec_to_dict(spec),
        }

    def history(self, name: str) -> dict[str, Any]:
        _instance(self.daemon.engine, name)
        return self.daemon.monitor.history_json(name)

    def events(self, since: int, limit: int) -> dict[str, Any]:
        events, nxt = self.daemon.journal.read(since, limit)
        return {"events": events, "next": nxt}

    def end_canary_watch(self, promote: bool) -> dict[str, Any]:
        """`POST /v1/rollout`: end the canary's watch now (docs/canary.md); 409 when no
        canary is being watched."""
        if not self.daemon.engine.end_canary_watch(promote):
            raise ControlError("no canary is being watched (`vsup status` says)", status=409)
        return {"ended": True, "action": "promote" if promote else "abort"}

    async def save(self, path: str, parents: bool = False) -> dict[str, Any]:
        if not self.daemon.layout_toml:
            raise ControlError("no layout is running; `vsup up LAYOUT` first", status=409)
        from vsup.fsutil import UnsafeTarget, regular_target

        try:
            target = regular_target(path, parents=parents, not_inside=self.daemon.home)
        except UnsafeTarget as exc:
            raise ControlError(f"not saved: {exc}", status=400) from None
        saved = await self._write_layout(self.daemon.layout_toml, path, target, parents)
        # The file says what the layout wants, not what runs: name what still runs another
        # spec (a rollout not finished, or one a killed daemon left half-done).
        outdated = [i.name for i in self.daemon.snapshot().instances if i.lifecycle.outdated]
        self.daemon.journal.append(
            ActionEvent(action="save", path=path, written=str(target), outdated=outdated)
        )
        return {
            "path": path,
            "written": str(target),
            "outdated": outdated,
            # the comments and formatting of the file replaced (or of the layout applied)
            "kept_format": saved.kept,
            "format_lost": saved.lost,  # what of them could not be kept, in words; or null
        }

    async def _write_layout(self, toml: str, path: str, target: Path, parents: bool) -> Saved:
        """Write the running layout (`toml`, compiled) to `target`, keeping the comments of the
        layout applied; a ControlError when it does not validate or cannot be written."""
        compiled = self.daemon.layout
        try:
            if compiled is None:
                # restored from the state file, and it did not compile then: it may now
                compiled, diags = await asyncio.to_thread(
                    compile_layout, toml, self.daemon.layout_path, self.daemon.node_facts
                )
                if compiled is None:
                    raise LayoutError(diags)
            if parents:
                target.parent.mkdir(parents=True, exist_ok=True)
            return await asyncio.to_thread(
                functools.partial(
                    save_layout,
                    compiled.layout,
                    target,
                    node=self.daemon.node_facts,
                    keep_from=toml,  # a new file keeps the comments of the layout applied
                )
            )
        except LayoutError as exc:
            raise ControlError(
                f"the running layout does not validate; nothing was written to {path}",
                status=422,
                body={"errors": [d.to_json() for d in exc.diagnostics if d.is_error]},
            ) from None
        except OSError as exc:
            raise ControlError(
                f"cannot write {target}: {exc.strerror or exc}", status=400
            ) from None

    async def shutdown(self, stop_instances: bool) -> dict[str, Any]:
        if self.daemon.shutting_down:
            return {"stopping": [], "already": True}
        self.daemon.shutting_down = True
        names = [n for n, i in self.daemon.engine.instances.items() if i.state != State.STOPPED]
        if not stop_instances:
            names = []
        self.daemon.journal.append(ActionEvent(action="shutdown", stop_instances=stop_instances))
        self.daemon.spawn(self.daemon.shut_down(stop_instances), "shutdown")
        return {"stopping": names}


def _instance(engine: Engine, name: str) -> Instance:
    inst = engine.instances.get(name)
    if inst is None:
        raise UnknownInstances([name], engine.instances)
    return inst


def _refused(
    errors: list[dict[str, Any]], warnings: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"plan": None, "errors": errors, "warnings": warnings or [], "applied": False}
