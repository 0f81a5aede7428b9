"""The control API: a Starlette app the daemon serves over `$VSUP_HOME/vsup.sock`.

Routes are listed in docs/ARCHITECTURE.md ("Control API"). This module only checks requests and
shapes answers; the work is the daemon's (`ControlService`). Bad arguments get 400 with a
message saying what to send instead, unknown instance names 404 naming them, and every error is
`{"error": message}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vsup.control.errors import BadRequest, ControlError, UnknownInstances
from vsup.fsutil import data_from, hole_from, hole_note

log = logging.getLogger(__name__)

ACTIONS = ("start", "stop", "restart", "drain")
# vLLM's sleep mode (docs/sleep.md): `swap` names two instances, the first sleeps, the second
# wakes; `sleep` may carry a `level`.
SLEEP_ACTIONS = ("sleep", "wake", "swap")
# The layout's vllm-router in an action's `names` (engine.routing.ROUTER_NAME: no instance
# name can start with '@'); `all` means every instance, not the router.
ROUTER = "@router"
MAX_LOG_CHUNK = 1024 * 1024  # bytes of log text in one answer
DEFAULT_TAIL = 64 * 1024
MAX_BODY = 4 * 1024 * 1024  # a layout TOML is a few KB
# Bodies up to this size are parsed on the loop (well under a millisecond); bigger ones (up to
# MAX_BODY) in a worker thread.
INLINE_PARSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogFile:
    """Which file holds an instance's log for a run."""

    run: int | None
    path: Path | None


class ControlService(Protocol):
    """What the daemon provides to the API (each method may raise ControlError)."""

    def instance_names(self) -> list[str]: ...

    def ping(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def layout(self) -> dict[str, Any]: ...

    async def layouts(self) -> dict[str, Any]: ...

    async def apply(
        self,
        toml: str,
        path: str | None,
        dry_run: bool,
        all_at_once: bool = False,
        pull: bool = True,
        rollback_of: int | None = None,
    ) -> dict[str, Any]: ...

    async def action(self, action: str, names: list[str], wait: bool) -> dict[str, Any]: ...

    async def sleep_action(
        self, action: str, names: list[str], level: int | None, wait: bool
    ) -> dict[str, Any]: ...

    def log_file(self, name: str, previous: bool) -> LogFile: ...

    def router_log_file(self, previous: bool) -> LogFile: ...

    def config(self, name: str) -> dict[str, Any]: ...

    def history(self, name: str) -> dict[str, Any]: ...

    def events(self, since: int, limit: int) -> dict[str, Any]: ...

    async def save(self, path: str, parents: bool = False) -> dict[str, Any]: ...

    async def shutdown(self, stop_instances: bool) -> dict[str, Any]: ...

    def end_canary_watch(self, promote: bool) -> dict[str, Any]: ...

    def bench_progress(self, report: dict[str, Any]) -> dict[str, Any]: ...


# A route's handler: the request's checks, then the service's answer (the JSON body of a 200).
# Each raises ControlError (BadRequest, UnknownInstances, ...) for an answer of another status.
Handler = Callable[[ControlService, Request], Awaitable[Any]]


def build_app(service: ControlService) -> Starlette:
    """The ASGI app for `service`: ROUTES, each answering JSON, and the error answers."""
    from starlette.exceptions import HTTPException

    return Starlette(
        routes=[
            Route(path, _endpoint(service, handler), methods=[method])
            for method, path, handler in ROUTES
        ],
        exception_handlers={
            ControlError: _control_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
    )


def _endpoint(
    service: ControlService, handler: Handler
) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def endpoint(request: Request) -> JSONResponse:
        return JSONResponse(await handler(service, request))

    endpoint.__name__ = handler.__name__.lstrip("_")
    return endpoint


# -- the daemon and its layout


async def _ping(service: ControlService, request: Request) -> Any:
    return service.ping()


async def _status(service: ControlService, request: Request) -> Any:
    return service.status()


async def _layout(service: ControlService, request: Request) -> Any:
    return service.layout()


async def _layouts(service: ControlService, request: Request) -> Any:
    return await service.layouts()


async def _apply(service: ControlService, request: Request) -> Any:
    body = await _body(
        request,
        required={"toml": str},
        optional={
            "path": (str, type(None)),
            "dry_run": bool,
            "all_at_once": bool,
            "pull": bool,
            "rollback_of": int,
        },
    )
    path = body.get("path")
    if path is not None and not os.path.isabs(path):
        raise BadRequest(f"'path' must be absolute (got {path!r}); the daemon has its own cwd")
    dry_run = body.get("dry_run", False)
    # only keys that are not their default reach the service (its older callers)
    extra: dict[str, Any] = {}
    if body.get("all_at_once", False):
        extra["all_at_once"] = True
    if not body.get("pull", True):
        extra["pull"] = False  # `vsup up --no-pull`: start from the cache or let vLLM fetch
    if "rollback_of" in body:
        if body["rollback_of"] < 0:
            raise BadRequest(
                f"'rollback_of' must be a kept layout's seq (got {body['rollback_of']})"
            )
        extra["rollback_of"] = body["rollback_of"]  # `vsup rollback`: journaled with the apply
    return await service.apply(body["toml"], path, dry_run, **extra)


async def _save(service: ControlService, request: Request) -> Any:
    body = await _body(request, required={"path": str}, optional={"parents": bool})
    if not os.path.isabs(body["path"]):
        raise BadRequest(f"'path' must be absolute (got {body['path']!r})")
    return await service.save(body["path"], body.get("parents", False))


async def _rollout(service: ControlService, request: Request) -> Any:
    body = await _body(request, required={"action": str})
    if body["action"] not in ("promote", "abort"):
        raise BadRequest(f"'action' must be 'promote' or 'abort' (got {body['action']!r})")
    return service.end_canary_watch(body["action"] == "promote")


async def _shutdown(service: ControlService, request: Request) -> Any:
    body = await _body(request, optional={"stop_instances": bool})
    return await service.shutdown(body.get("stop_instances", True))


# -- actions: start, stop, restart, drain; sleep mode's sleep, wake, swap


async def _actions(service: ControlService, request: Request) -> Any:
    body = await _body(
        request,
        required={"action": str},
        optional={"names": list, "all": bool, "wait": bool, "level": int},
    )
    action = body["action"]
    if action not in ACTIONS + SLEEP_ACTIONS:
        raise BadRequest(
            f"unknown action {action!r}; use one of: {', '.join(ACTIONS + SLEEP_ACTIONS)}"
        )
    names = body.get("names") or []
    if not all(isinstance(n, str) and n for n in names):
        raise BadRequest("'names' must be a list of instance names (strings)")
    known = service.instance_names()
    if action in SLEEP_ACTIONS:
        return await _sleep_action(service, action, names, body, known)
    return await _instance_action(service, action, names, body, known)


async def _instance_action(
    service: ControlService, action: str, names: list[str], body: dict[str, Any], known: list[str]
) -> Any:
    if body.get("all"):
        if names:
            raise BadRequest("give 'names' or 'all', not both")
        if action == "drain":
            raise BadRequest("drain takes instance names, not 'all'")
        names = list(known)
    elif not names:
        raise BadRequest("no instance named: give 'names' or set 'all'")
    if ROUTER in names and action == "drain":
        raise BadRequest("drain takes instances; the router has no requests of its own")
    _check_names([n for n in names if n != ROUTER], known)
    return await service.action(action, list(dict.fromkeys(names)), body.get("wait", True))


async def _sleep_action(
    service: ControlService, action: str, names: list[str], body: dict[str, Any], known: list[str]
) -> Any:
    if body.get("all") or ROUTER in names:
        raise BadRequest(f"{action} takes instance names (not 'all', not the router)")
    want = 2 if action == "swap" else 1
    if len(names) != want:
        shape = (
            "two instances: the one to sleep, then the one to wake"
            if want == 2
            else ("one instance")
        )
        raise BadRequest(f"{action} takes {shape}")
    level = body.get("level")
    if level is not None and (action != "sleep" or level not in (1, 2)):
        raise BadRequest("'level' goes with sleep only, and is 1 or 2")
    _check_names(names, known)
    return await service.sleep_action(action, names, level, body.get("wait", True))


# -- an instance's log, config and history; the router's log


async def _logs(service: ControlService, request: Request) -> Any:
    name = _known(request, service)
    previous, offset, tail = _log_query(request)
    lf = service.log_file(name, previous)
    if lf.path is None:
        raise ControlError(f"instance {name!r} has no {_no_log(previous)}", status=404)
    return await _log_chunk(lf, offset, tail)


async def _router_logs(service: ControlService, request: Request) -> Any:
    # the layout's vllm-router (`vsup logs @router`); the same query and answer as an
    # instance's log
    previous, offset, tail = _log_query(request)
    lf = service.router_log_file(previous)
    if lf.path is None:
        raise ControlError(f"the router has no {_no_log(previous)}", status=404)
    return await _log_chunk(lf, offset, tail)


def _log_query(request: Request) -> tuple[bool, int | None, int | None]:
    """A log request's `previous`, `offset` and `tail`."""
    q = request.query_params
    _only(q.keys(), ("previous", "offset", "tail"), "query")
    previous = _flag(q.get("previous"), "previous")
    offset = _nonneg(q.get("offset"), "offset")
    tail = _nonneg(q.get("tail"), "tail")
    if offset is not None and tail is not None:
        raise BadRequest("give 'offset' or 'tail', not both")
    return previous, offset, tail


def _no_log(previous: bool) -> str:
    return "previous run" if previous else "log yet"


async def _log_chunk(lf: LogFile, offset: int | None, tail: int | None) -> dict[str, Any]:
    assert lf.path is not None
    chunk = await asyncio.to_thread(read_log_chunk, lf.path, offset, tail)
    return {"run": lf.run, "path": str(lf.path), **chunk}


async def _config(service: ControlService, request: Request) -> Any:
    return service.config(_known(request, service))


async def _history(service: ControlService, request: Request) -> Any:
    return service.history(_known(request, service))


# -- the journal


async def _events(service: ControlService, request: Request) -> Any:
    q = request.query_params
    _only(q.keys(), ("since", "limit"), "query")
    since = _nonneg(q.get("since"), "since") or 0
    limit = _nonneg(q.get("limit"), "limit")
    limit = 1000 if limit is None else max(1, min(limit, 10000))
    return service.events(since, limit)


# -- `vsup bench` / `vsup tune` progress reports

_COUNT = (int, type(None))
BENCH_PROGRESS_KEYS: dict[str, Any] = {
    "layout": (str, type(None)),
    "index": _COUNT,
    "count": _COUNT,
    "requests_done": _COUNT,
    "requests_total": _COUNT,
    "elapsed_s": (int, float),
    "started_at": (str, type(None)),
    "tool": str,
    "eta_s": (int, float, type(None)),
}


async def _bench_progress(service: ControlService, request: Request) -> Any:
    from vsup.control.benchprogress import PHASES
    from vsup.snapshot import BENCH_TOOLS

    body = await _body(request, required={"pid": int, "phase": str}, optional=BENCH_PROGRESS_KEYS)
    if body["phase"] not in PHASES:
        raise BadRequest(f"unknown phase {body['phase']!r}; use one of: {', '.join(PHASES)}")
    if body["pid"] <= 0:
        raise BadRequest(f"'pid' must be a process id (got {body['pid']})")
    if body.get("tool", "bench") not in BENCH_TOOLS:
        raise BadRequest(f"unknown tool {body['tool']!r}; use one of: {', '.join(BENCH_TOOLS)}")
    return service.bench_progress(body)


# method, path, handler: docs/ARCHITECTURE.md ("Control API") describes each
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/v1/ping", _ping),
    ("GET", "/v1/status", _status),
    ("GET", "/v1/layout", _layout),
    ("GET", "/v1/layouts", _layouts),
    ("POST", "/v1/apply", _apply),
    ("POST", "/v1/actions", _actions),
    ("GET", "/v1/instances/{name}/logs", _logs),
    ("GET", "/v1/router/logs", _router_logs),
    ("GET", "/v1/instances/{name}/config", _config),
    ("GET", "/v1/instances/{name}/history", _history),
    ("GET", "/v1/events", _events),
    ("POST", "/v1/save", _save),
    ("POST", "/v1/shutdown", _shutdown),
    ("POST", "/v1/rollout", _rollout),
    ("POST", "/v1/bench/progress", _bench_progress),
)


# -- the error answers: every one is {"error": message}


async def _control_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ControlError)
    return JSONResponse({**exc.body, "error": exc.message}, status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", "") or ""
    if status == 404:
        detail = f"no route {request.method} {request.url.path}"
    elif status == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    return JSONResponse({"error": detail}, status_code=status)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("control API: %s %s failed", request.method, request.url.path)
    return JSONResponse(
        {"error": f"internal error: {type(exc).__name__}: {exc} (see daemon.log)"},
        status_code=500,
    )


async def _body(
    request: Request,
    required: dict[str, Any] | None = None,
    optional: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON object body, with key presence and types checked."""
    required = required or {}
    optional = optional or {}
    raw = await read_body(request)
    if len(raw) > INLINE_PARSE_BYTES:
        # A big body is parsed in a worker thread: the loop keeps supervising meanwhile.
        data = await asyncio.to_thread(decode_body, raw)
    else:
        data = decode_body(raw)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    allowed = {**required, **optional}
    _only(data.keys(), allowed, "key")
    for key, types in allowed.items():
        if key not in data:
            if key in required:
                raise BadRequest(f"missing {key!r}")
            continue
        value = data[key]
        if not isinstance(value, types) or (isinstance(value, bool) and types is not bool):
            want = _type_names(types)
            raise BadRequest(f"{key!r} must be {want} (got {type(value).__name__})")
    return data


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) as soon as it passes MAX_BODY: a declared length over it
    is refused before reading, and a streamed one stops being read at the limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise ControlError(f"request body over {MAX_BODY} bytes (declared {declared})", status=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ControlError(f"request body over {MAX_BODY} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(raw: bytes) -> Any:
    """A request body as JSON (an empty one is `{}`); BadRequest when it is not JSON.

    Linear in the body's size: the stdlib's C parser, which refuses nesting deeper than the
    recursion limit with RecursionError (a 400 here). No route takes more than a list inside
    an object, so the type checks after it refuse any deeper body. The parser holds the GIL:
    in a worker thread it still pauses the loop while it runs, ~0.1 s for a 4 MiB layout and
    up to ~0.6 s for 4 MiB of empty arrays (CPU time measured on the CI machine)."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadRequest(
            "the body nests more levels deep than can be parsed; no request nests more than "
            "two (a list in an object)"
        ) from None
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None


def _type_names(types: Any) -> str:
    names = {
        str: "a string",
        bool: "true or false",
        list: "a list",
        int: "an integer",
        float: "a number",
    }
    if isinstance(types, tuple):
        return " or ".join("null" if t is type(None) else names.get(t, t.__name__) for t in types)
    return names.get(types, types.__name__)


def _only(keys: Iterable[str], allowed: Iterable[str], what: str) -> None:
    extra = sorted(set(keys) - set(allowed))
    if extra:
        raise BadRequest(
            f"unknown {what} {', '.join(repr(k) for k in extra)}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}"
        )


def _flag(value: str | None, key: str) -> bool:
    if value is None:
        return False
    v = value.lower()
    if v in ("1", "true", "yes"):
        return True
    if v in ("0", "false", "no", ""):
        return False
    raise BadRequest(f"{key!r} must be 0 or 1 (got {value!r})")


def _nonneg(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise BadRequest(f"{key!r} must be a whole number (got {value!r})") from None
    if n < 0:
        raise BadRequest(f"{key!r} must not be negative (got {n})")
    return n


def _check_names(names: Iterable[str], known: Iterable[str]) -> None:
    known = list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownInstances(unknown, known)


def _known(request: Request, service: ControlService) -> str:
    name = request.path_params["name"]
    _check_names([name], service.instance_names())
    return name


def read_log_chunk(path: Path, offset: int | None, tail: int | None) -> dict[str, Any]:
    """Read part of a log: from `offset`, or the last `tail` bytes (default 64 KiB).

    Answers `{"start", "offset" (where the next read starts), "size", "text", "eof"}`.
    A tail starts at a line boundary; text is UTF-8 with undecodable bytes replaced. A part
    released past the log's cap (a hole, engine/runlog.py) is skipped: the text then starts
    with a line saying how many bytes were released, and the next whole line after it.
    """
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return {"start": 0, "offset": 0, "size": 0, "text": "", "eof": True}
    with fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        start = _chunk_start(size, offset, tail)
        note = ""
        resync = offset is None and start > 0  # a tail starts at a line start
        data_at = data_from(fd, start) if start < size else start
        if data_at > start:
            note = hole_note(data_at - start)
            start, resync = data_at, True
        hole_at = hole_from(fd, start)
        fh.seek(start)
        data = fh.read(max(0, min(MAX_LOG_CHUNK, hole_at - start, size - start)))
    if resync:
        nl = data.find(b"\n")
        if nl >= 0:
            data = data[nl + 1 :]
            start += nl + 1
    if offset is not None and start + len(data) < size:
        data, start = _to_line_end(data, start, hole_at)
    end = start + len(data)
    return {
        "start": start,
        "offset": end,
        "size": size,
        "text": note + data.decode("utf-8", errors="replace"),
        "eof": end >= size,
    }


def _chunk_start(size: int, offset: int | None, tail: int | None) -> int:
    """Where a read starts: `tail` bytes (DEFAULT_TAIL) before the end without an offset; the
    offset, or 0 when the log shrank below it (a cap on a file system without holes cut it:
    restart)."""
    if offset is None:
        want = DEFAULT_TAIL if tail is None else tail
        return max(0, size - want)
    return offset if offset <= size else 0


def _to_line_end(data: bytes, start: int, hole_at: int) -> tuple[bytes, int]:
    """More follows `data` (read at `start`): stop at a line end so no line (or UTF-8
    character) is split; a line the cap's hole (at `hole_at`) cut in two is left out (the
    note after it says why)."""
    nl = data.rfind(b"\n")
    if nl >= 0:
        return data[: nl + 1], start
    if start + len(data) >= hole_at:
        return b"", hole_at
    return data, start
