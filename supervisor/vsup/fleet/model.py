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
and the key.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ERROR = "error"
WARNING = "warning"
MAX_FILE_BYTES = 1024 * 1024

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# ssh's destination: an alias, [user@]host, or ssh://[user@]host[:port]. No spaces, no option
# (a leading '-'), no password in the user part.
DEST_RE = re.compile(r"^(ssh://)?([A-Za-z0-9._][A-Za-z0-9._-]*@)?[A-Za-z0-9._:\[\]-]+$")
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0

FLEET_KEYS = {"name", "ssh_config", "timeout_s", "connect_timeout_s"}
NODE_KEYS = {"name", "ssh", "home", "vsup", "groups", "metrics_host"}
TOP_KEYS = {"fleet", "node", "groups"}


@dataclass(frozen=True)
class Diagnostic:
    """One problem of a fleet file: `FILE:LINE: error: node 'gpu01': key 'ssh': message`.
    (The layout's Diagnostic has the same shape; importing the layout package would cost
    every `vsup fleet status` 0.2 s of CPU.)"""

    severity: str
    message: str
    file: str | None = None
    line: int | None = None
    instance: str | None = None  # unused: the layout's shape
    key: str | None = None
    table: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def format(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        parts = [f"{where}{self.severity}"]
        if self.table:
            parts.append(self.table)
        if self.key:
            parts.append(f"key '{self.key}'")
        parts.append(self.message)
        return ": ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "key": self.key,
            "table": self.table,
            "text": self.format(),
        }


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
    """The fleet from TOML text (`path` names it in diagnostics and anchors `ssh_config`)."""
    file = str(path) if path else "<fleet>"
    errors: list[Diagnostic] = []
    warnings: list[Diagnostic] = []

    def err(
        message: str, node: str | None = None, key: str | None = None, table: str | None = None
    ) -> None:
        table = table or (f"node '{node}'" if node else None)
        errors.append(Diagnostic(ERROR, message, file=file, key=key, table=table))

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _toml_line(str(exc))
        errors.append(Diagnostic(ERROR, f"not valid TOML: {exc}", file=file, line=line))
        return Fleet(path, errors=tuple(errors))
    for key in sorted(set(doc) - TOP_KEYS):
        err(f"unknown table or key (allowed: {', '.join(sorted(TOP_KEYS))})", key=key)
    head = doc.get("fleet", {})
    if not isinstance(head, dict):
        err("must be a table: [fleet]", key="fleet")
        head = {}
    for key in sorted(set(head) - FLEET_KEYS):
        err(f"unknown key (allowed: {', '.join(sorted(FLEET_KEYS))})", key=key, table="[fleet]")
    name = head.get("name")
    if name is not None and not isinstance(name, str):
        err("must be a string", key="name", table="[fleet]")
        name = None
    timeouts = {}
    for key, default in (
        ("timeout_s", DEFAULT_TIMEOUT_S),
        ("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S),
    ):
        value = head.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 600:
            err(
                "must be a number of seconds, more than 0 and at most 600", key=key, table="[fleet]"
            )
            value = default
        timeouts[key] = float(value)
    ssh_config = None
    if "ssh_config" in head:
        raw = head["ssh_config"]
        if not isinstance(raw, str) or not raw:
            err("must be a path (relative to the fleet file)", key="ssh_config", table="[fleet]")
        else:
            base = path.parent if path else Path.cwd()
            ssh_config = (base / Path(raw).expanduser()).absolute()
            if not ssh_config.is_file():
                err(f"{ssh_config} is not a file", key="ssh_config", table="[fleet]")

    raw_nodes = doc.get("node", [])
    if not isinstance(raw_nodes, list):
        err("write nodes as [[node]] tables", key="node")
        raw_nodes = []
    nodes: list[Node] = []
    seen: dict[str, str] = {}
    for index, table in enumerate(raw_nodes, 1):
        label = f"[[node]] #{index}"
        if not isinstance(table, dict):
            err("must be a table", table=label)
            continue
        node_name = table.get("name")
        if not isinstance(node_name, str) or not NAME_RE.match(node_name):
            err(
                "every node needs a name: 1-64 letters, digits, '.', '_' or '-'",
                key="name",
                table=label,
            )
            continue
        where = node_name
        for key in sorted(set(table) - NODE_KEYS):
            err(f"unknown key (allowed: {', '.join(sorted(NODE_KEYS))})", node=where, key=key)
        if node_name in seen:
            err("a second node of this name; names must be unique", node=where, key="name")
            continue
        dest = table.get("ssh")
        if not isinstance(dest, str) or not dest:
            err('missing: how to reach it, a Host alias or "user@host"', node=where, key="ssh")
            continue
        if ":" in dest.removeprefix("ssh://").partition("@")[0] and "@" in dest:
            err(
                "holds a password (user:password@host); authentication belongs to SSH "
                "(keys, an agent), never in this file",
                node=where,
                key="ssh",
            )
            continue
        bare = dest.removeprefix("ssh://").rpartition("@")[2]
        if not dest.startswith("ssh://") and re.fullmatch(r"[^:\[\]]+:\d+", bare):
            err(
                f"{dest!r}: ssh takes no :PORT here; write ssh://{dest} or a Host alias with Port",
                node=where,
                key="ssh",
            )
            continue
        if not DEST_RE.match(dest) or dest.startswith("-"):
            err(
                f"{dest!r} is not an ssh destination: a Host alias, user@host or ssh://user@host:port",
                node=where,
                key="ssh",
            )
            continue
        if dest in seen.values():
            twin = next(k for k, v in seen.items() if v == dest)
            warnings.append(
                Diagnostic(
                    WARNING,
                    f"the same ssh destination as node '{twin}'; fine only if their homes differ",
                    file=file,
                    table=f"node '{where}'",
                    key="ssh",
                )
            )
        home = table.get("home")
        if home is not None and (not isinstance(home, str) or not home.startswith(("/", "~"))):
            err("must be an absolute path on the node (or start with ~)", node=where, key="home")
            home = None
        vsup = table.get("vsup", "vsup")
        words: list[str] = []
        if isinstance(vsup, str) and vsup.strip():
            words = shlex.split(vsup)
        elif isinstance(vsup, list) and vsup and all(isinstance(w, str) and w for w in vsup):
            words = list(vsup)
        else:
            err(
                'must be the remote command: a string ("vsup") or a list of words',
                node=where,
                key="vsup",
            )
            words = ["vsup"]
        groups = table.get("groups", [])
        if not isinstance(groups, list) or not all(
            isinstance(g, str) and NAME_RE.match(g) for g in groups
        ):
            err("must be a list of group names", node=where, key="groups")
            groups = []
        metrics_host = table.get("metrics_host")
        if metrics_host is not None and (not isinstance(metrics_host, str) or not metrics_host):
            err("must be a host name or address", node=where, key="metrics_host")
            metrics_host = None
        seen[node_name] = dest
        nodes.append(Node(node_name, dest, home, tuple(words), tuple(groups), metrics_host))
    if not nodes and not errors:
        err("no nodes: add [[node]] tables with name and ssh", key="node")

    group_map: dict[str, list[str]] = {}
    for n in nodes:
        for g in n.groups:
            group_map.setdefault(g, []).append(n.name)
    raw_groups = doc.get("groups", {})
    if not isinstance(raw_groups, dict):
        err("must be a table of group = [node names]", key="groups")
        raw_groups = {}
    for g, members in raw_groups.items():
        if (
            not NAME_RE.match(g)
            or not isinstance(members, list)
            or not all(isinstance(m, str) for m in members)
        ):
            err("must be a list of node names", key=f"groups.{g}")
            continue
        for m in members:
            if m not in seen:
                err(f"names node {m!r}, which the file does not have", key=f"groups.{g}")
            elif m not in group_map.setdefault(g, []):
                group_map[g].append(m)
    clash = set(group_map) & set(seen)
    for g in sorted(clash):
        warnings.append(
            Diagnostic(
                WARNING,
                "a group and a node of the same name: --group and --nodes tell them apart",
                file=file,
                key=f"groups.{g}",
            )
        )
    return Fleet(
        path,
        name=name,
        nodes=tuple(nodes),
        ssh_config=ssh_config,
        timeout_s=timeouts["timeout_s"],
        connect_timeout_s=timeouts["connect_timeout_s"],
        errors=tuple(errors),
        warnings=tuple(warnings),
        groups={g: tuple(m) for g, m in group_map.items()},
    )


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
