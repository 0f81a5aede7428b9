"""Clients of the control API over `$VSUP_HOME/vsup.sock`: `Client` (sync, the CLI) and
`AsyncClient` (the TUI), one method per route (docs/ARCHITECTURE.md, "Control API").

`connect()` is what every CLI command calls: it returns a client for a running daemon and,
for a command that changes something (`start=True`), starts one when none answers
(`python -m vsup daemon`, detached in its own session, its output in `$VSUP_HOME/daemon.log`).
Read-only commands pass `start=False` and get `NoDaemon` instead. Two commands racing both
spawn; the daemon lock lets one win and the other exits, and both end up talking to the winner.
"""

from __future__ import annotations

import json as jsonlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode

from vsup import paths
from vsup.answers import (
    ActionAnswer,
    ApplyAnswer,
    BadAnswer,
    BenchProgressAnswer,
    History,
    InstanceConfig,
    LayoutAnswer,
    LogChunk,
    Ping,
    SaveAnswer,
    ShutdownAnswer,
    decode,
    status_from_json,
)
from vsup.control.errors import ControlError, DaemonUnavailable
from vsup.control.lock import live_daemon_holder
from vsup.snapshot import StatusSnapshot
from vsup.udshttp import BrokenAnswer, unix_request

if TYPE_CHECKING:
    import httpx

    from vsup.journalevents import EventPage

# Long enough for a stop with drain (drain_timeout_s + stop_grace_s with default specs).
ACTION_TIMEOUT_S = 3600.0
DEFAULT_TIMEOUT_S = 30.0
START_TIMEOUT_S = 30.0
# A live daemon whose socket file is missing binds it again within its check period (2 s).
REBIND_WAIT_S = 8.0
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


def check_socket_path(sock: Path) -> None:
    """Unix socket paths are short; say which setting to change when this one is too long."""
    n = len(os.fsencode(str(sock)))
    if n > MAX_SOCKET_PATH:
        raise DaemonUnavailable(
            f"the control socket path {sock} is {n} bytes, over the {MAX_SOCKET_PATH}-byte limit "
            "of unix sockets; set VSUP_HOME to a shorter directory"
        )


class NoDaemon(DaemonUnavailable):
    """No daemon runs for this VSUP_HOME, and the command was one that does not start one
    (a read-only command: `status`, `logs`, `events`, `save`, `tui --readonly`)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        super().__init__(no_daemon_message(home))


def no_daemon_message(home: Path) -> str:
    """`no vsup daemon runs for VSUP_HOME=...`, and what starts one: named so that a person
    who set no VSUP_HOME (or another one) sees which directory was asked."""
    from vsup.control.liveness import recorded_live_instances  # reads the state file

    where = f"VSUP_HOME={home}" + ("" if os.environ.get("VSUP_HOME") else " (the default)")
    live = recorded_live_instances(home)
    if live:
        return (
            f"no vsup daemon runs for {where}; instances its last daemon started still run "
            f"unwatched ({', '.join(live)}): `vsup daemon --detach` takes them back (nothing "
            "else changes)"
        )
    return (
        f"no vsup daemon runs for {where}: `vsup up LAYOUT` starts one with a layout, "
        "`vsup daemon --detach` starts it alone (with the layout it ran last, if any); set "
        "VSUP_HOME if the daemon you mean runs elsewhere"
    )


class BadName(ControlError):
    """An instance name that no layout can hold, refused before any request is made."""


def check_name(name: str) -> str:
    """`name` if it can be an instance name (the layout's rule); else BadName, on one line."""
    from vsup.layout.schema import NAME_RE  # here: the layout package is heavy for every CLI call

    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BadName(
            f"{name!r} is not an instance name: names are 1-64 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit (`vsup status` lists them)",
            status=400,
        )
    return name


# The layout's vllm-router where a command takes an instance name (`vsup logs @router`,
# `vsup restart @router`): no instance name can start with '@' (engine.routing.ROUTER_NAME).
ROUTER = "@router"


def check_target(name: str) -> str:
    """`name` if it names an instance or the router (`@router`); else BadName."""
    return name if name == ROUTER else check_name(name)


def action_body(
    action: str, names: list[str] | None, all: bool, wait: bool, level: int | None
) -> dict[str, Any]:
    """`POST /v1/actions`'s body. `swap` names two instances: the first sleeps, the second
    wakes (docs/sleep.md)."""
    body: dict[str, Any] = {
        "action": action,
        "names": [check_target(n) for n in names or ()],
        "all": all,
        "wait": wait,
    }
    if level is not None:
        body["level"] = level
    return body


def _instance_path(name: str, what: str) -> str:
    """The route of one instance's resource, its name checked and URL-encoded."""
    return f"/v1/instances/{quote(check_name(name), safe='')}/{what}"


def _raise_for(resp: httpx.Response) -> Any:
    return _answer(resp.status_code, resp.content)


def _answer(status: int, payload: bytes) -> Any:
    """The JSON document answered; a ControlError (the document's `error` as its message)
    for an HTTP error status."""
    try:
        body = jsonlib.loads(payload)
    except ValueError:
        body = {"error": payload.decode("utf-8", "replace").strip() or f"HTTP {status}"}
    if status >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        raise ControlError(
            message or f"HTTP {status}",
            status=status,
            body=body if isinstance(body, dict) else {},
        )
    return body


def apply_body(
    toml: str,
    path: str | None,
    dry_run: bool,
    all_at_once: bool = False,
    pull: bool = True,
    rollback_of: int | None = None,
) -> dict[str, Any]:
    """`POST /v1/apply`'s body; keys at their default are left out (older daemons)."""
    body: dict[str, Any] = {"toml": toml, "path": path, "dry_run": dry_run}
    if all_at_once:
        body["all_at_once"] = True  # restart serving instances together, not in waves
    if not pull:
        body["pull"] = False  # hub models not complete in the cache go to vLLM as written
    if rollback_of is not None:
        body["rollback_of"] = rollback_of  # `vsup rollback`: the kept layout's seq, journaled
    return body


def _logs_path(name: str) -> str:
    """An instance's log route, or the router's (`@router`)."""
    return "/v1/router/logs" if name == ROUTER else _instance_path(name, "logs")


def _logs_params(previous: bool, offset: int | None, tail: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"previous": int(bool(previous))}
    if offset is not None:
        params["offset"] = offset
    if tail is not None:
        params["tail"] = tail
    return params


class JsonClient:
    """The wire, synchronously: one method per route, each returning the route's JSON document
    (`Client` reads them as types). Raises ControlError for refusals, DaemonUnavailable when
    nothing answers on the socket."""

    def __init__(
        self,
        home: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        socket: Path | None = None,
    ) -> None:
        # `socket`: an explicit control socket (the fleet's forwarded one of a remote node)
        self.home = Path(home) if home else (Path(socket).parent if socket else paths.vsup_home())
        self.socket = Path(socket) if socket else paths.socket_path(self.home)
        check_socket_path(self.socket)
        self.timeout = timeout

    def close(self) -> None:
        """Nothing is kept open between requests (one connection each)."""

    def __enter__(self) -> JsonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        timeout: float | None = None,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """One request on a connection of its own; the JSON answer. TimeoutError when the
        daemon takes longer than `timeout` (the client's by default)."""
        if params:
            path += "?" + urlencode(params)
        data = b"" if json is None else jsonlib.dumps(json).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: vsup\r\nAccept: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(data)}\r\n"
        )
        if json is not None:
            head += "Content-Type: application/json\r\n"
        try:
            status, payload = unix_request(
                str(self.socket),
                head.encode() + b"\r\n" + data,
                self.timeout if timeout is None else timeout,
            )
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            raise DaemonUnavailable(f"no vsup daemon answers on {self.socket} ({exc})") from exc
        except (BrokenAnswer, ConnectionError) as exc:
            # a daemon that exits (vsup down) resets the connections it still holds
            raise DaemonUnavailable(
                f"the vsup daemon on {self.socket} closed the connection ({exc})"
            ) from exc
        return _answer(status, payload)

    def alive(self, timeout: float = 2.0) -> Any:
        """The daemon's ping answer, or None when none answers."""
        if not self.socket.exists():
            return None
        try:
            return self._call("GET", "/v1/ping", timeout=timeout)
        except (DaemonUnavailable, TimeoutError, ControlError):
            return None

    def ping(self) -> Any:
        return self._call("GET", "/v1/ping")

    def status(self) -> Any:
        return self._call("GET", "/v1/status")

    def layout(self) -> Any:
        return self._call("GET", "/v1/layout")

    def layouts(self) -> Any:
        """The last applied layouts, newest first, and the running one's text (`vsup
        rollback`)."""
        return self._call("GET", "/v1/layouts")

    def apply(
        self,
        toml: str,
        path: str | None = None,
        dry_run: bool = False,
        all_at_once: bool = False,
        pull: bool = True,
        rollback_of: int | None = None,
    ) -> Any:
        """`rollback_of`: the kept layout `vsup rollback` applies (a daemon older than the key
        refuses it: a 400 that names it)."""
        body = apply_body(toml, path, dry_run, all_at_once, pull, rollback_of)
        return self._call("POST", "/v1/apply", json=body)

    def action(
        self,
        action: str,
        names: list[str] | None = None,
        all: bool = False,
        wait: bool = True,
        level: int | None = None,
    ) -> Any:
        """`level`: `sleep`'s level (1 or 2; None: the instance's `sleep.level`)."""
        body = action_body(action, names, all, wait, level)
        return self._call("POST", "/v1/actions", json=body, timeout=ACTION_TIMEOUT_S)

    def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> Any:
        return self._call("GET", _logs_path(name), params=_logs_params(previous, offset, tail))

    def router_logs(
        self, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> Any:
        """The router's run log: the same answer as an instance's `logs`."""
        return self.logs(ROUTER, previous, offset, tail)

    def config(self, name: str) -> Any:
        return self._call("GET", _instance_path(name, "config"))

    def history(self, name: str) -> Any:
        return self._call("GET", _instance_path(name, "history"))

    def events(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"since": since}
        if limit is not None:
            params["limit"] = limit
        return self._call("GET", "/v1/events", params=params)

    def save(self, path: str | os.PathLike[str], parents: bool = False) -> Any:
        body = {"path": os.path.abspath(path), "parents": parents}
        return self._call("POST", "/v1/save", json=body)

    def shutdown(self, stop_instances: bool = True) -> Any:
        return self._call("POST", "/v1/shutdown", json={"stop_instances": stop_instances})

    def rollout(self, action: str) -> Any:
        """End a canary's watch: `action` promote | abort (docs/canary.md)."""
        return self._call("POST", "/v1/rollout", json={"action": action})

    def bench_progress(self, report: dict[str, Any], timeout: float = 5.0) -> Any:
        """Report a bench's progress (`vsup bench` does, each second); answers `{"bench"}`."""
        return self._call("POST", "/v1/bench/progress", json=report, timeout=timeout)


class Client:
    """Synchronous client (the CLI): the routes' answers as types (vsup.answers; status as a
    `StatusSnapshot`). `json` is the same connection answering the routes' JSON documents.
    Raises ControlError for refusals (and for an answer not of its route's shape),
    DaemonUnavailable when nothing answers on the socket."""

    def __init__(
        self,
        home: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        socket: Path | None = None,
    ) -> None:
        self.json = JsonClient(home, timeout, socket)
        self.home, self.socket = self.json.home, self.json.socket

    def close(self) -> None:
        self.json.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def alive(self, timeout: float = 2.0) -> Ping | None:
        """The daemon's ping answer, or None when none answers."""
        doc = self.json.alive(timeout)
        return None if doc is None else _typed(Ping, doc, "GET /v1/ping")

    def ping(self) -> Ping:
        return _typed(Ping, self.json.ping(), "GET /v1/ping")

    def status(self) -> StatusSnapshot:
        return _snapshot(self.json.status())

    def status_json(self) -> dict[str, Any]:
        """The status document as the daemon sent it (`vsup status --json`, schema 1)."""
        doc: dict[str, Any] = self.json.status()
        return doc

    def layout(self) -> LayoutAnswer:
        return _typed(LayoutAnswer, self.json.layout(), "GET /v1/layout")

    def apply(
        self,
        toml: str,
        path: str | None = None,
        dry_run: bool = False,
        all_at_once: bool = False,
        pull: bool = True,
        rollback_of: int | None = None,
    ) -> ApplyAnswer:
        doc = self.json.apply(toml, path, dry_run, all_at_once, pull, rollback_of)
        return _typed(ApplyAnswer, doc, "POST /v1/apply")

    def action(
        self,
        action: str,
        names: list[str] | None = None,
        all: bool = False,
        wait: bool = True,
        level: int | None = None,
    ) -> ActionAnswer:
        """`level`: `sleep`'s level (1 or 2; None: the instance's `sleep.level`)."""
        doc = self.json.action(action, names, all, wait, level)
        return _typed(ActionAnswer, doc, "POST /v1/actions")

    def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> LogChunk:
        doc = self.json.logs(name, previous, offset, tail)
        return _typed(LogChunk, doc, f"GET {_logs_path(name)}")

    def router_logs(
        self, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> LogChunk:
        """The router's run log: the same answer as an instance's `logs`."""
        return self.logs(ROUTER, previous, offset, tail)

    def config(self, name: str) -> InstanceConfig:
        doc = self.json.config(name)
        return _typed(InstanceConfig, doc, f"GET {_instance_path(name, 'config')}")

    def history(self, name: str) -> History:
        doc = self.json.history(name)
        return _typed(History, doc, f"GET {_instance_path(name, 'history')}")

    def events(self, since: int = 0, limit: int | None = None) -> EventPage:
        """The journal's events with `seq >= since`, typed (vsup.journalevents)."""
        from vsup.journalevents import EventPage

        return EventPage.from_json(self.json.events(since, limit))

    def save(self, path: str | os.PathLike[str], parents: bool = False) -> SaveAnswer:
        return _typed(SaveAnswer, self.json.save(path, parents), "POST /v1/save")

    def shutdown(self, stop_instances: bool = True) -> ShutdownAnswer:
        doc = self.json.shutdown(stop_instances)
        return _typed(ShutdownAnswer, doc, "POST /v1/shutdown")

    def bench_progress(self, report: dict[str, Any], timeout: float = 5.0) -> BenchProgressAnswer:
        """Report a bench's progress (`vsup bench` does, each second)."""
        doc = self.json.bench_progress(report, timeout)
        return _typed(BenchProgressAnswer, doc, "POST /v1/bench/progress")


class AsyncJsonClient:
    """The wire, awaitable (the daemon's tests; `AsyncClient` reads the answers as types)."""

    def __init__(
        self,
        home: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        socket: Path | None = None,
    ) -> None:
        # `socket`: an explicit control socket (the fleet's forwarded one of a remote node)
        self.home = Path(home) if home else (Path(socket).parent if socket else paths.vsup_home())
        self.socket = Path(socket) if socket else paths.socket_path(self.home)
        check_socket_path(self.socket)
        import httpx  # the dashboard's client only: the CLI's commands use the stdlib one

        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
            base_url="http://vsup",
            timeout=timeout,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncJsonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, timeout: float | None = None, **kw: Any) -> Any:
        import httpx

        if timeout is not None:
            kw["timeout"] = timeout
        try:
            resp = await self._http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError) as exc:
            raise DaemonUnavailable(f"no vsup daemon answers on {self.socket} ({exc})") from exc
        except (httpx.ReadError, httpx.WriteError) as exc:
            raise DaemonUnavailable(
                f"the vsup daemon on {self.socket} closed the connection ({exc})"
            ) from exc
        return _raise_for(resp)

    async def ping(self) -> Any:
        return await self._call("GET", "/v1/ping")

    async def status(self) -> Any:
        return await self._call("GET", "/v1/status")

    async def layout(self) -> Any:
        return await self._call("GET", "/v1/layout")

    async def layouts(self) -> Any:
        return await self._call("GET", "/v1/layouts")

    async def apply(
        self,
        toml: str,
        path: str | None = None,
        dry_run: bool = False,
        rollback_of: int | None = None,
    ) -> Any:
        body = apply_body(toml, path, dry_run, rollback_of=rollback_of)
        return await self._call("POST", "/v1/apply", json=body)

    async def action(
        self,
        action: str,
        names: list[str] | None = None,
        all: bool = False,
        wait: bool = True,
        level: int | None = None,
    ) -> Any:
        body = action_body(action, names, all, wait, level)
        return await self._call("POST", "/v1/actions", json=body, timeout=ACTION_TIMEOUT_S)

    async def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> Any:
        params = _logs_params(previous, offset, tail)
        return await self._call("GET", _logs_path(name), params=params)

    async def router_logs(
        self, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> Any:
        """The router's run log: the same answer as an instance's `logs`."""
        return await self.logs(ROUTER, previous, offset, tail)

    async def config(self, name: str) -> Any:
        return await self._call("GET", _instance_path(name, "config"))

    async def history(self, name: str) -> Any:
        return await self._call("GET", _instance_path(name, "history"))

    async def events(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"since": since}
        if limit is not None:
            params["limit"] = limit
        return await self._call("GET", "/v1/events", params=params)

    async def save(self, path: str | os.PathLike[str], parents: bool = False) -> Any:
        body = {"path": os.path.abspath(path), "parents": parents}
        return await self._call("POST", "/v1/save", json=body)

    async def shutdown(self, stop_instances: bool = True) -> Any:
        return await self._call("POST", "/v1/shutdown", json={"stop_instances": stop_instances})

    async def rollout(self, action: str) -> Any:
        """End a canary's watch: `action` promote | abort (docs/canary.md)."""
        return await self._call("POST", "/v1/rollout", json={"action": action})


class AsyncClient:
    """Asynchronous client (the TUI): the same methods as `Client`, awaitable, typed the same
    way (`json`: the wire's documents). It never starts a daemon; call `connect()` (sync,
    before the app runs) for that."""

    def __init__(
        self,
        home: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        socket: Path | None = None,
    ) -> None:
        self.json = AsyncJsonClient(home, timeout, socket)
        self.home, self.socket = self.json.home, self.json.socket

    async def aclose(self) -> None:
        await self.json.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def ping(self) -> Ping:
        return _typed(Ping, await self.json.ping(), "GET /v1/ping")

    async def status(self) -> StatusSnapshot:
        return _snapshot(await self.json.status())

    async def status_json(self) -> dict[str, Any]:
        """The status document as the daemon sent it (schema 1)."""
        doc: dict[str, Any] = await self.json.status()
        return doc

    async def layout(self) -> LayoutAnswer:
        return _typed(LayoutAnswer, await self.json.layout(), "GET /v1/layout")

    async def apply(
        self,
        toml: str,
        path: str | None = None,
        dry_run: bool = False,
        rollback_of: int | None = None,
    ) -> ApplyAnswer:
        doc = await self.json.apply(toml, path, dry_run, rollback_of)
        return _typed(ApplyAnswer, doc, "POST /v1/apply")

    async def action(
        self,
        action: str,
        names: list[str] | None = None,
        all: bool = False,
        wait: bool = True,
        level: int | None = None,
    ) -> ActionAnswer:
        doc = await self.json.action(action, names, all, wait, level)
        return _typed(ActionAnswer, doc, "POST /v1/actions")

    async def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> LogChunk:
        doc = await self.json.logs(name, previous, offset, tail)
        return _typed(LogChunk, doc, f"GET {_logs_path(name)}")

    async def router_logs(
        self, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> LogChunk:
        """The router's run log: the same answer as an instance's `logs`."""
        return await self.logs(ROUTER, previous, offset, tail)

    async def config(self, name: str) -> InstanceConfig:
        doc = await self.json.config(name)
        return _typed(InstanceConfig, doc, f"GET {_instance_path(name, 'config')}")

    async def history(self, name: str) -> History:
        doc = await self.json.history(name)
        return _typed(History, doc, f"GET {_instance_path(name, 'history')}")

    async def events(self, since: int = 0, limit: int | None = None) -> EventPage:
        """The journal's events with `seq >= since`, typed (vsup.journalevents)."""
        from vsup.journalevents import EventPage

        return EventPage.from_json(await self.json.events(since, limit))

    async def save(self, path: str | os.PathLike[str], parents: bool = False) -> SaveAnswer:
        return _typed(SaveAnswer, await self.json.save(path, parents), "POST /v1/save")

    async def shutdown(self, stop_instances: bool = True) -> ShutdownAnswer:
        doc = await self.json.shutdown(stop_instances)
        return _typed(ShutdownAnswer, doc, "POST /v1/shutdown")

    async def rollout(self, action: str) -> dict[str, Any]:
        """End a canary's watch (`vsup rollout promote|abort`; 409 when none is watched)."""
        doc: dict[str, Any] = await self.json.rollout(action)
        return doc


_A = TypeVar("_A")


def _typed(cls: type[_A], doc: Any, route: str) -> _A:
    """`doc` read as `cls`; an answer not of that shape is a ControlError saying so (status
    502: the daemon answered, but not what this client reads)."""
    try:
        return decode(cls, doc, route)
    except BadAnswer as exc:
        raise ControlError(f"{exc} (a vsup daemon of another version?)", status=502) from None


def _snapshot(doc: Any) -> StatusSnapshot:
    try:
        return status_from_json(doc)
    except BadAnswer as exc:
        raise ControlError(f"{exc} (a vsup daemon of another version?)", status=502) from None


def daemon_command() -> list[str]:
    """How a client starts the daemon: this interpreter, this copy of vsup."""
    return [sys.executable, "-m", "vsup", "daemon"]


def spawn_daemon(home: Path) -> subprocess.Popen:
    """Start a detached daemon for `home`: its own session (an SSH hang-up never reaches it),
    no terminal, output appended to `$VSUP_HOME/daemon.log`."""
    env = dict(os.environ)
    env["VSUP_HOME"] = str(home)
    # The daemon is this interpreter with the installed `vsup` package (`daemon_command`), started
    # in VSUP_HOME: nothing depends on the client's working directory.
    # 0600: VSUP_HOME keeps the mode it was found with (a home directory may be 0755)
    log = os.fdopen(
        os.open(home / "daemon.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab"
    )
    try:
        return subprocess.Popen(
            daemon_command(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=str(home),
            env=env,
        )
    finally:
        log.close()


def connect(
    home: Path | None = None,
    start: bool = True,
    timeout: float = START_TIMEOUT_S,
    on_wait: Callable[[float], object] | None = None,
) -> Client:
    """A client for the running daemon, starting one if `start` and none answers.

    With `start` False (read-only commands: they never start a daemon) a daemon that holds
    the lock but is still starting is waited for, and none at all raises NoDaemon.

    Waits at most `timeout` seconds for a new daemon's socket to answer; `on_wait(elapsed)` is
    called while waiting (progress on a terminal). A live daemon that holds the lock but does
    not answer is not doubled: while its socket file is missing (it re-binds one within
    seconds) the wait is REBIND_WAIT_S, and while it starts up, `timeout`. Raises
    DaemonUnavailable with what to do (or the end of daemon.log) when no daemon comes up.
    """
    client = Client(home)
    if client.alive() is not None:
        return client
    holder = live_daemon_holder(client.home)
    if not start and holder is None:
        client.close()
        raise NoDaemon(client.home)
    proc = spawn_daemon(client.home) if holder is None else None
    try:
        _wait_answering(client, proc, start, timeout, on_wait)
    except BaseException:
        client.close()
        raise
    return client


def _wait_answering(
    client: Client,
    proc: subprocess.Popen | None,
    start: bool,
    timeout: float,
    on_wait: Callable[[float], object] | None,
) -> None:
    """Until a daemon answers on `client`'s socket: the one `proc` is (spawned here), or with
    `proc` None the one that holds the lock (spawning one, if `start`, when it exits)."""
    t0 = time.monotonic()
    delay = 0.02
    while True:
        if client.alive(timeout=1.0) is not None:
            return
        elapsed = time.monotonic() - t0
        if proc is None:
            # Waiting on a daemon that is already there: it answers, re-binds or exits.
            holder = live_daemon_holder(client.home)
            if holder is None:
                if client.alive() is not None:
                    return
                if not start:
                    raise NoDaemon(client.home)  # it exited meanwhile
                proc = spawn_daemon(client.home)  # it exited meanwhile: start a new one
                t0 = time.monotonic()
                continue
            _check_held(client, holder, elapsed, timeout)
        else:
            _check_spawned(client, proc, elapsed, timeout)
        if on_wait is not None:
            on_wait(elapsed)
        # A spawned daemon that lost the lock race exits 0 at once; the winner answers soon.
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def _check_held(client: Client, holder: int, elapsed: float, timeout: float) -> None:
    """DaemonUnavailable once the daemon `holder` (it holds the lock) has not answered for
    too long: `timeout` while it starts, REBIND_WAIT_S while its socket file is missing."""
    limit = timeout if client.socket.exists() else REBIND_WAIT_S
    if elapsed > limit:
        raise DaemonUnavailable(
            f"the vsup daemon (pid {holder}) serves {client.home} but does not answer on "
            f"{client.socket}; see {client.home / 'daemon.log'}, or `kill -TERM {holder}`"
            " (its instances keep running) and run the command again"
        )


def _check_spawned(client: Client, proc: subprocess.Popen, elapsed: float, timeout: float) -> None:
    """DaemonUnavailable when the daemon spawned here did not answer within `timeout`, or
    exited with a failure while starting (the end of its log says why)."""
    code = proc.poll()
    if elapsed > timeout:
        raise DaemonUnavailable(
            f"the vsup daemon did not answer within {timeout:.0f} s"
            + (f" (it exited with status {code})" if code is not None else "")
            + _log_tail(client.home)
        )
    if code is not None and code != 0 and client.alive() is None:
        # 0 is a daemon that lost the lock race to another; anything else is a failure.
        raise DaemonUnavailable(
            f"the vsup daemon exited with status {code} while starting" + _log_tail(client.home)
        )


def _log_tail(home: Path, lines: int = 15) -> str:
    try:
        text = (home / "daemon.log").read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"; end of {home / 'daemon.log'}:\n{tail}" if tail else ""
