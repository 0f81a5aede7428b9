"""The control service: what each control API route asks of the daemon (`api.ControlService`).

Requests are checked by `api.py`; this part does the work on the daemon's engine, journal and
monitor. `DaemonService` is `Daemon.service`; what it uses of the daemon is `host.DaemonHost`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from vsup import __version__
from vsup.control.alerts import AlertConfig
from vsup.control.api import LogFile
from vsup.control.errors import Conflict, ControlError, UnknownInstances
from vsup.control.host import DaemonHost
from vsup.control.state import spec_to_dict
from vsup.engine import Engine, Instance
from vsup.engine.routing import ROUTER_NAME
from vsup.layout.listen import parse_listen
from vsup.layout.secrets import SECRET_NAME


class DaemonService:
    """`api.ControlService` over a daemon: what each route does."""

    def __init__(self, daemon: DaemonHost) -> None:
        self.daemon = daemon

    def instance_names(self) -> list[str]:
        return list(self.daemon.engine.instances)

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": __version__, "home": str(self.daemon.home)}

    def status(self) -> dict[str, Any]:
        doc = self.daemon.build_snapshot().to_json()
        # the latest rolling apply (engine/rollout.py); additive to schema 1
        rollout = self.daemon.engine.rollout
        doc["rollout"] = rollout.to_json() if rollout is not None else None
        # a `vsup bench` in progress (control/benchprogress.py); additive to schema 1
        doc["bench"] = self.daemon.bench.current()
        return doc

    def bench_progress(self, report: dict[str, Any]) -> dict[str, Any]:
        self.daemon.bench.update(report)
        return {"bench": self.daemon.bench.current()}

    def layout(self) -> dict[str, Any]:
        return {
            "path": self.daemon.layout_path,
            "toml": self.daemon.layout_toml,
            "name": self.daemon.layout_name,
        }

    async def apply(
        self, toml: str, path: str | None, dry_run: bool, all_at_once: bool = False
    ) -> dict[str, Any]:
        if self.daemon.shutting_down:
            raise Conflict("the daemon is shutting down (vsup down); run `vsup up` afterwards")
        layout_obj, specs, diags = await asyncio.to_thread(
            parse_layout, toml, path, self.daemon.node.gpu_count
        )
        errors = [d.to_json() for d in diags if d.is_error]
        warnings = [d.to_json() for d in diags if not d.is_error]
        if errors:
            return _refused(errors, warnings)
        plan: dict[str, Any] = self.daemon.engine.diff(specs, rolling=not all_at_once).to_json()
        router = _router_of(layout_obj, specs)
        plan["router"] = self.daemon.engine.router.diff(router)  # additive: start|restart|...
        if dry_run:
            return {"plan": plan, "errors": [], "warnings": warnings, "applied": False}
        self.daemon.layout_toml, self.daemon.layout_path = toml, path
        self.daemon.layout_name = layout_obj.name
        # The layout's text rides with the event: a daemon that finds both state files bad
        # takes the running layout back from the journal (`last_layout`).
        self.daemon.journal.append(
            "action",
            None,
            action="apply",
            layout=self.daemon.layout_name,
            path=path,
            plan=plan,
            toml=toml,
        )
        self.daemon.state_changed()
        self.daemon.alerts.configure(alert_config_of(toml))
        self.daemon.metrics_listen = metrics_listen_of(toml)
        if self.daemon.metrics_listen:
            if not await self.daemon.start_metrics():
                warnings.append(
                    {
                        "severity": "warning",
                        "message": self.daemon.problems[-1].message,
                        "text": self.daemon.problems[-1].message,
                    }
                )
        else:
            await self.daemon.metrics.stop()
        async with self.daemon.apply_lock:
            # The router first: its members follow as the instances become ready.
            router_action = await self.daemon.engine.router.apply(router)
            # Returns once every start is under way (stops of removed instances continue).
            plan = dict(
                (
                    await self.daemon.engine.apply(
                        specs, rolling=not all_at_once, **_rollout_keys(layout_obj)
                    )
                ).to_json()
            )
            plan["router"] = router_action
        self.daemon.state_changed()
        return {"plan": plan, "errors": [], "warnings": warnings, "applied": True}

    async def action(self, action: str, names: list[str], wait: bool) -> dict[str, Any]:
        if self.daemon.shutting_down:
            raise Conflict("the daemon is shutting down (vsup down)")
        router = self.daemon.engine.router
        if ROUTER_NAME in names and router.inst is None:
            raise ControlError("the running layout has no [router]", status=404)
        self.daemon.journal.append("action", None, action=action, names=names, by="operator")

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

    async def save(self, path: str, parents: bool = False) -> dict[str, Any]:
        if not self.daemon.layout_toml:
            raise ControlError("no layout is running; `vsup up LAYOUT` first", status=409)
        from vsup.fsutil import UnsafeTarget, regular_target
        from vsup.layout import LayoutError, loads_layout, save_layout

        try:
            target = regular_target(path, parents=parents)
        except UnsafeTarget as exc:
            raise ControlError(f"not saved: {exc}", status=400) from None
        layout_obj = loads_layout(self.daemon.layout_toml, self.daemon.layout_path)
        try:
            if parents:
                target.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(
                save_layout, layout_obj, target, node_gpus=self.daemon.node.gpu_count or None
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
        self.daemon.journal.append("action", None, action="save", path=path, written=str(target))
        return {"path": path, "written": str(target)}

    async def shutdown(self, stop_instances: bool) -> dict[str, Any]:
        if self.daemon.shutting_down:
            return {"stopping": [], "already": True}
        self.daemon.shutting_down = True
        names = [n for n, i in self.daemon.engine.instances.items() if i.state != "stopped"]
        if not stop_instances:
            names = []
        self.daemon.journal.append("action", None, action="shutdown", stop_instances=stop_instances)
        self.daemon.spawn(self.daemon.shut_down(stop_instances), "shutdown")
        return {"stopping": names}


def _instance(engine: Engine, name: str) -> Instance:
    inst = engine.instances.get(name)
    if inst is None:
        raise UnknownInstances([name], engine.instances)
    return inst


def parse_layout(toml: str, path: str | None, node_gpus: int) -> tuple[Any, list, list]:
    """(layout, specs, diagnostics) of a layout text; specs is [] when it has errors."""
    from vsup.layout import LayoutError, loads_layout, validate

    layout_obj = loads_layout(toml, path)
    diags = list(validate(layout_obj, node_gpus=node_gpus or None))
    listen = layout_obj.header.get("metrics_listen")
    if listen is not None and not any(d.is_error for d in diags):
        try:
            parse_listen(str(listen))
        except ValueError as exc:
            from vsup.layout.diagnostics import Diagnostic

            diags.insert(
                0, Diagnostic("error", str(exc), file=path, table="[layout]", key="metrics_listen")
            )
    if any(d.is_error for d in diags):
        return layout_obj, [], diags
    try:
        specs = layout_obj.resolve()
    except LayoutError as exc:
        return layout_obj, [], list(exc.diagnostics)
    return layout_obj, specs, diags


def _router_of(layout_obj: Any, specs: list) -> Any:
    """The layout's RouterSpec, or None without a `[router]` table."""
    from vsup.router import router_spec

    return router_spec(layout_obj, specs)


def layout_diagnostics(path: Path | str) -> list:
    """Validation of a layout file on this node (what `vsup up` checks before applying)."""
    from vsup.layout.validate import validate_file

    _layout, diags = validate_file(str(path))
    return list(diags)


def _rollout_keys(layout_obj: Any) -> dict[str, Any]:
    """[layout] max_unavailable / drain_timeout_s as Engine.apply's keywords."""
    header = layout_obj.header
    return {
        "max_unavailable": int(header.get("max_unavailable", 1)),
        "drain_timeout_s": (
            float(header["drain_timeout_s"]) if "drain_timeout_s" in header else None
        ),
    }


def metrics_listen_of(toml: str) -> str | None:
    """`[layout] metrics_listen` of a layout text, read through the layout loader."""
    from vsup.layout import loads_layout

    value = loads_layout(toml).header.get("metrics_listen")
    return value if isinstance(value, str) and value else None


def alert_config_of(toml: str) -> AlertConfig | None:
    """`[alerts]` of a layout text, as the alerts take it (None when the table is absent)."""
    from vsup.layout import loads_layout

    return AlertConfig.from_table(loads_layout(toml).alerts)


def _refused(errors: list, warnings: list | None = None) -> dict[str, Any]:
    return {"plan": None, "errors": errors, "warnings": warnings or [], "applied": False}
