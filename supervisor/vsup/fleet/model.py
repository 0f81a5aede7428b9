"""The fleet file (TOML, kept in git by the operators): the nodes and how to reach them.

```toml
[fleet]
name = "prod"              # optional, shown in the dashboard's title
ssh_config = "ssh_config"  # optional: `ssh -F` this file (relative to the fleet file) instead
                           # of ~/.ssh/config; leave it out to use the operator's own
timeout_s = 5              # a node's status answer, once connected (default 5)
connect_timeout_s = 10     # SSH's ConnectTimeout and the first connection's budget (default 10)

[[node]]
name = "gpu01"             # 1-64 letters, digits, '.', '_', '-'
ssh = "gpu01"              # a Host alias of the ssh config, `user@host` or `ssh://user@host:port`
home = "/srv/vsup"         # optional: the node's VSUP_HOME (default: the remote vsup's own)
vsup = "/opt/vsup/bin/vsup"   # optional: the remote command (a string or a list; default vsup)
groups = ["rack1"]         # optional
metrics_host = "gpu01.example"  # optional: where Prometheus reaches its exporter

[groups]                   # optional, another way to say the same
rack2 = ["gpu03", "gpu04"]
```

Nothing secret belongs here and nothing here can hold one: authentication is SSH's (keys,
agents, certificates through the ssh config); a `user:password@host` is refused. `load_fleet`
never raises for bad input: it returns the fleet with `errors`, each naming the file, the node
and the key (the rules that say them: `vsup.fleet.rules`).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.diagnostics import ERROR, Diagnostic
from vsup.fleet.rules import (
    BAD,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    FLEET_FIELDS,
    NODE_FIELDS,
    FleetCheck,
    NodeTable,
    check,
    fleet_groups,
    ssh_config_path,
)

MAX_FILE_BYTES = 1024 * 1024


def read_text(path: Path) -> str:
    """A regular UTF-8 file of at most 1 MiB (not a FIFO, not /dev/zero); ValueError says why."""
    import os
    import stat as stat_mod

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ValueError(
            "no fleet file there: write one ([[node]] tables with name and ssh; docs/fleet.md), "
            "or name it with --fleet FILE or VSUP_FLEET"
        ) from None
    except OSError as exc:
        raise ValueError(f"cannot read the fleet file: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"over {MAX_FILE_BYTES} bytes: not a fleet file")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None


@dataclass(frozen=True)
class Node:
    """One node of the fleet, as the fleet file says how to reach it."""

    name: str
    ssh: str  # the ssh destination (a Host alias, user@host, ssh://user@host:port)
    home: str | None = None  # the node's VSUP_HOME; None: what the remote vsup uses by default
    vsup: tuple[str, ...] = ("vsup",)  # the remote command
    groups: tuple[str, ...] = ()
    metrics_host: str | None = None

    def remote_command(self, *args: str) -> str:
        """The command line the remote shell runs: `env VSUP_HOME=... vsup ARGS` (env, not a
        shell assignment: it works in any login shell), every word quoted."""
        words = list(self.vsup) + list(args)
        if self.home:
            words = ["env", f"VSUP_HOME={self.home}", *words]
        return " ".join(shlex.quote(w) for w in words)


@dataclass(frozen=True)
class Fleet:
    path: Path | None
    name: str | None = None
    nodes: tuple[Node, ...] = ()
    ssh_config: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    errors: tuple[Diagnostic, ...] = ()
    warnings: tuple[Diagnostic, ...] = ()
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def select(self, nodes: Iterable[str] = (), group: str | None = None) -> list[Node]:
        """The nodes named (in the order given) or in `group` (in file order); every node when
        neither is given. KeyError names what is unknown and what exists."""
        names = [n for n in nodes if n]
        if group is not None:
            if group not in self.groups:
                known = ", ".join(sorted(self.groups)) or "none"
                raise KeyError(f"no group {group!r} in {self.path} (groups: {known})")
            members = set(self.groups[group])
            return [n for n in self.nodes if n.name in members]
        if not names:
            return list(self.nodes)
        unknown = [n for n in names if self.node(n) is None]
        if unknown:
            known = ", ".join(n.name for n in self.nodes)
            raise KeyError(f"no node {', '.join(unknown)} in {self.path} (nodes: {known})")
        return [self.node(n) for n in dict.fromkeys(names)]  # type: ignore[misc]


def default_fleet_path() -> Path:
    """`$VSUP_FLEET`, else `$XDG_CONFIG_HOME/vsup/fleet.toml` (~/.config/vsup/fleet.toml)."""
    import os

    env = os.environ.get("VSUP_FLEET")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "vsup" / "fleet.toml"


def load_fleet(path: Path | str) -> Fleet:
    """The fleet file at `path`, validated; never raises (see `Fleet.errors`)."""
    path = Path(path).expanduser().absolute()
    try:
        text = read_text(path)
    except ValueError as exc:
        return Fleet(path, errors=(Diagnostic(ERROR, str(exc), file=str(path)),))
    return loads_fleet(text, path)


def loads_fleet(text: str, path: Path | None = None) -> Fleet:
    """The fleet from TOML text (`path` names it in diagnostics and anchors `ssh_config`):
    validated by the rules of vsup.fleet.rules, built from the values and nodes they keep."""
    file = str(path) if path else "<fleet>"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _toml_line(str(exc))
        return Fleet(
            path, errors=(Diagnostic(ERROR, f"not valid TOML: {exc}", file=file, line=line),)
        )
    ctx = FleetCheck(file, path, doc)
    said = check(ctx)
    head = ctx.head
    ssh_config = ssh_config_path(head, path)
    return Fleet(
        path,
        name=FLEET_FIELDS["name"].value(head),
        nodes=tuple(_node(n) for n in ctx.kept.values()),
        ssh_config=None if ssh_config is BAD else ssh_config,
        timeout_s=FLEET_FIELDS["timeout_s"].value(head),
        connect_timeout_s=FLEET_FIELDS["connect_timeout_s"].value(head),
        errors=tuple(d for d in said if d.is_error),
        warnings=tuple(d for d in said if not d.is_error),
        groups=fleet_groups(ctx),
    )


def _node(kept: NodeTable) -> Node:
    values = {key: f.value(kept.table) for key, f in NODE_FIELDS.items()}
    return Node(kept.name, kept.dest, **values)


def _toml_line(message: str) -> int | None:
    m = re.search(r"line (\d+)", message)
    return int(m.group(1)) if m else None


def describe(fleet: Fleet) -> dict[str, Any]:
    """The fleet as JSON (`vsup fleet validate --json`)."""
    return {
        "path": str(fleet.path) if fleet.path else None,
        "name": fleet.name,
        "ssh_config": str(fleet.ssh_config) if fleet.ssh_config else None,
        "timeout_s": fleet.timeout_s,
        "connect_timeout_s": fleet.connect_timeout_s,
        "nodes": [
            {
                "name": n.name,
                "ssh": n.ssh,
                "home": n.home,
                "vsup": list(n.vsup),
                "groups": list(n.groups),
                "metrics_host": n.metrics_host,
            }
            for n in fleet.nodes
        ],
        "groups": {g: list(m) for g, m in fleet.groups.items()},
        "errors": [d.to_json() for d in fleet.errors],
        "warnings": [d.to_json() for d in fleet.warnings],
    }
