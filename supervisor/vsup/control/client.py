"""Clients of the control API over `$VSUP_HOME/vsup.sock`: `Client` (sync, the CLI) and
`AsyncClient` (the TUI), one method per route (docs/ARCHITECTURE.md, "Control API").

`connect()` is what every CLI command calls: it returns a client for a running daemon and,
for a command that changes something (`start=True`), starts one when none answers
(`python -m vsup daemon`, detached in its own session, its output in `$VSUP_HOME/daemon.log`).
Read-only commands pass `start=False` and get `NoDaemon` instead. Two commands racing both
spawn; the daemon lock lets one win and the other exits, and both end up talking to the winner.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from vsup import paths
from vsup.control.errors import ControlError, DaemonUnavailable
from vsup.control.lock import live_daemon_holder

if TYPE_CHECKING:
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
    try:
        body = resp.json()
    except ValueError:
        body = {"error": resp.text.strip() or f"HTTP {resp.status_code}"}
    if resp.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        raise ControlError(
            message or f"HTTP {resp.status_code}",
            status=resp.status_code,
            body=body if isinstance(body, dict) else {},
        )
    return body


def _logs_params(previous: bool, offset: int | None, tail: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"previous": int(bool(previous))}
    if offset is not None:
        params["offset"] = offset
    if tail is not None:
        params["tail"] = tail
    return params


class Client:
    """Synchronous client (the CLI). Raises ControlError for refusals, DaemonUnavailable when
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
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://vsup",
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, timeout: float | None = None, **kw: Any) -> Any:
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            resp = self._http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError) as exc:
            raise DaemonUnavailable(f"no vsup daemon answers on {self.socket} ({exc})") from exc
        except (httpx.ReadError, httpx.WriteError) as exc:
            # a daemon that exits (vsup down) resets the connections it still holds
            raise DaemonUnavailable(
                f"the vsup daemon on {self.socket} closed the connection ({exc})"
            ) from exc
        return _raise_for(resp)

    def alive(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The daemon's ping answer, or None when none answers."""
        if not self.socket.exists():
            return None
        try:
            return self._call("GET", "/v1/ping", timeout=timeout)
        except (DaemonUnavailable, httpx.TimeoutException, ControlError):
            return None

    def ping(self) -> dict[str, Any]:
        return self._call("GET", "/v1/ping")

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def layout(self) -> dict[str, Any]:
        return self._call("GET", "/v1/layout")

    def apply(
        self,
        toml: str,
        path: str | None = None,
        dry_run: bool = False,
        all_at_once: bool = False,
        pull: bool = True,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"toml": toml, "path": path, "dry_run": dry_run}
        if all_at_once:
            body["all_at_once"] = True  # restart serving instances together, not in waves
        if not pull:
            body["pull"] = False  # hub models not complete in the cache go to vLLM as written
        return self._call("POST", "/v1/apply", json=body)

    def action(
        self,
        action: str,
        names: list[str] | None = None,
        all: bool = False,
        wait: bool = True,
        level: int | None = None,
    ) -> dict[str, Any]:
        """`level`: `sleep`'s level (1 or 2; None: the instance's `sleep.level`)."""
        body = action_body(action, names, all, wait, level)
        return self._call("POST", "/v1/actions", json=body, timeout=ACTION_TIMEOUT_S)

    def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> dict[str, Any]:
        if name == ROUTER:
            return self.router_logs(previous, offset, tail)
        return self._call(
            "GET", _instance_path(name, "logs"), params=_logs_params(previous, offset, tail)
        )

    def router_logs(
        self, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> dict[str, Any]:
        """The router's run log: the same answer as an instance's `logs`."""
        return self._call("GET", "/v1/router/logs", params=_logs_params(previous, offset, tail))

    def config(self, name: str) -> dict[str, Any]:
        return self._call("GET", _instance_path(name, "config"))

    def history(self, name: str) -> dict[str, Any]:
        return self._call("GET", _instance_path(name, "history"))

    def events(self, since: int = 0, limit: int | None = None) -> EventPage:
        """The journal's events with `seq >= since`, typed (vsup.journalevents)."""
        from vsup.journalevents import EventPage

        params: dict[str, Any] = {"since": since}
        if limit is not None:
            params["limit"] = limit
        return EventPage.from_json(self._call("GET", "/v1/events", params=params))

    def save(self, path: str | os.PathLike[str], parents: bool = False) -> dict[str, Any]:
        body = {"path": os.path.abspath(path), "parents": parents}
        return self._call("POST", "/v1/save", json=body)

    def shutdown(self, stop_instances: bool = True) -> dict[str, Any]:
        return self._call("POST", "/v1/shutdown", json={"stop_instances": stop_instances})

    def bench_progress(self, report: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """Report a bench's progress (`vsup bench` does, each second); answers `{"bench"}`."""
        return self._call("POST", "/v1/bench/progress", json=report, timeout=timeout)


class AsyncClient:
    """Asynchronous client (the TUI): the same methods as `Client`, awaitable. It never starts
    a daemon; call `connect()` (sync, before the app runs) for that."""

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
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
            base_url="http://vsup",
            timeout=timeout,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, timeout: float | None = None, **kw: Any) -> Any:
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

    async def ping(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/ping")

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/status")

    async def layout(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/layout")

    async def apply(
        self, toml: str, path: str | None = None, dry_run: bool = False
    ) -> dict[str, Any]:
        return await self._call(
            "POST", "/v1/apply", json={"toml": toml, "path": path, "dry_run": dry_run}
        )

    async def action(
        self,
        action: str,
        names: list[str] | None = None,
        all: bool = False,
        wait: bool = True,
        level: int | None = None,
    ) -> dict[str, Any]:
        body = action_body(action, names, all, wait, level)
        return await self._call("POST", "/v1/actions", json=body, timeout=ACTION_TIMEOUT_S)

    async def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> dict[str, Any]:
        if name == ROUTER:
            return await self.router_logs(previous, offset, tail)
        return await self._call(
            "GET", _instance_path(name, "logs"), params=_logs_params(previous, offset, tail)
        )

    async def router_logs(
        self, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> dict[str, Any]:
        """The router's run log: the same answer as an instance's `logs`."""
        return await self._call(
            "GET", "/v1/router/logs", params=_logs_params(previous, offset, tail)
        )

    async def config(self, name: str) -> dict[str, Any]:
        return await self._call("GET", _instance_path(name, "config"))

    async def history(self, name: str) -> dict[str, Any]:
        return await self._call("GET", _instance_path(name, "history"))

    async def events(self, since: int = 0, limit: int | None = None) -> EventPage:
        """The journal's events with `seq >= since`, typed (vsup.journalevents)."""
        from vsup.journalevents import EventPage

        params: dict[str, Any] = {"since": since}
        if limit is not None:
            params["limit"] = limit
        return EventPage.from_json(await self._call("GET", "/v1/events", params=params))

    async def save(self, path: str | os.PathLike[str], parents: bool = False) -> dict[str, Any]:
        body = {"path": os.path.abspath(path), "parents": parents}
        return await self._call("POST", "/v1/save", json=body)

    async def shutdown(self, stop_instances: bool = True) -> dict[str, Any]:
        return await self._call("POST", "/v1/shutdown", json={"stop_instances": stop_instances})


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
    t0 = time.monotonic()
    delay = 0.02
    while True:
        if client.alive(timeout=1.0) is not None:
            return client
        elapsed = time.monotonic() - t0
        if proc is None:
            # Waiting on a daemon that is already there: it answers, re-binds or exits.
            holder = live_daemon_holder(client.home)
            if holder is None:
                if client.alive() is not None:
                    return client
                if not start:
                    client.close()
                    raise NoDaemon(client.home)  # it exited meanwhile
                proc = spawn_daemon(client.home)  # it exited meanwhile: start a new one
                t0 = time.monotonic()
                continue
            limit = timeout if client.socket.exists() else REBIND_WAIT_S
            if elapsed > limit:
                client.close()
                raise DaemonUnavailable(
                    f"the vsup daemon (pid {holder}) serves {client.home} but does not answer on "
                    f"{client.socket}; see {client.home / 'daemon.log'}, or `kill -TERM {holder}`"
                    " (its instances keep running) and run the command again"
                )
        else:
            code = proc.poll()
            if elapsed > timeout:
                client.close()
                raise DaemonUnavailable(
                    f"the vsup daemon did not answer within {timeout:.0f} s"
                    + (f" (it exited with status {code})" if code is not None else "")
                    + _log_tail(client.home)
                )
            if code is not None and code != 0 and client.alive() is None:
                # 0 is a daemon that lost the lock race to another; anything else is a failure.
                client.close()
                raise DaemonUnavailable(
                    f"the vsup daemon exited with status {code} while starting"
                    + _log_tail(client.home)
                )
        if on_wait is not None:
            on_wait(elapsed)
        # A spawned daemon that lost the lock race exits 0 at once; the winner answers soon.
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def _log_tail(home: Path, lines: int = 15) -> str:
    try:
        text = (home / "daemon.log").read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"; end of {home / 'daemon.log'}:\n{tail}" if tail else ""
