"""The fleet file's validation: one small function per rule, each yielding its diagnostics.

The layout's style (vsup.layout.rules) with its one `Diagnostic` (vsup.diagnostics): a rule
looks at the parsed TOML through a `FleetCheck` and says what is wrong, naming the file, the
node (or table) and the key. `RULES` run in order over the document; `node_tables` runs
`NODE_RULES` over each `[[node]]` table, where a gate's error drops the node (the rules after
it are not run on it, and it is not kept: later nodes and the groups do not see it).

What a key holds once read is a `Field`'s reader, shared by the rule that refuses a bad value
and by `vsup.fleet.model.loads_fleet`, which builds the `Fleet` from the tables kept (a bad
value reads as the key's default). Only stdlib and the leaf vsup.diagnostics: the fleet
commands never import the layout package.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.diagnostics import ERROR, WARNING, Diagnostic

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
class Refused:
    """What a reader returns for a value it refuses; `why`, when given, says it instead of the
    field's message."""

    why: str | None = None


BAD: Any = Refused()


@dataclass(frozen=True)
class Field:
    """A key of a table: how its value is read (`read` returns a `Refused` for a value it
    refuses), what the error says then (the refusal's `why`, else `message`), and the value
    when it is left out or refused."""

    key: str
    read: Callable[[Any], Any]  # the value as written -> the value kept, or a Refused
    message: str
    default: Any

    def value(self, table: dict[str, Any]) -> Any:
        if self.key not in table:
            return self.default
        got = self.read(table[self.key])
        return self.default if isinstance(got, Refused) else got

    def refusal(self, table: dict[str, Any]) -> str | None:
        """What the error says of the value `table` holds; None when it is fine or left out."""
        got = self.read(table[self.key]) if self.key in table else None
        return (got.why or self.message) if isinstance(got, Refused) else None


def _string(value: Any) -> Any:
    return value if isinstance(value, str) else BAD


def _seconds(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 600:
        return BAD
    return float(value)


def _node_home(value: Any) -> Any:
    return value if isinstance(value, str) and value.startswith(("/", "~")) else BAD


def _command(value: Any) -> Any:
    if isinstance(value, str) and value.strip():
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:  # a quote left open
            why = f"{value!r} cannot be split into words ({exc}): close the quote, or write"
            return Refused(f"{why} the words as a list")
    if isinstance(value, list) and value and all(isinstance(w, str) and w for w in value):
        return tuple(value)
    return BAD


def _group_names(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(g, str) and NAME_RE.match(g) for g in value):
        return tuple(value)
    return BAD


def _host(value: Any) -> Any:
    return value if isinstance(value, str) and value else BAD


SECONDS = "must be a number of seconds, more than 0 and at most 600"
# [fleet]'s keys but ssh_config (a path relative to the file: `ssh_config_path`)
FLEET_FIELDS = {
    f.key: f
    for f in (
        Field("name", _string, "must be a string", None),
        Field("timeout_s", _seconds, SECONDS, DEFAULT_TIMEOUT_S),
        Field("connect_timeout_s", _seconds, SECONDS, DEFAULT_CONNECT_TIMEOUT_S),
    )
}
# a node's keys but name and ssh (the gates of NODE_RULES); named as Node's fields
NODE_FIELDS = {
    f.key: f
    for f in (
        Field("home", _node_home, "must be an absolute path on the node (or start with ~)", None),
        Field(
            "vsup",
            _command,
            'must be the remote command: a string ("vsup") or a list of words',
            ("vsup",),
        ),
        Field("groups", _group_names, "must be a list of group names", ()),
        Field("metrics_host", _host, "must be a host name or address", None),
    )
}


def ssh_config_path(head: dict[str, Any], path: Path | None) -> Any:
    """[fleet] ssh_config made absolute against the fleet file's directory (the cwd for a
    fleet without a file); None when left out, BAD when not a path."""
    if "ssh_config" not in head:
        return None
    raw = head["ssh_config"]
    if not isinstance(raw, str) or not raw:
        return BAD
    base = path.parent if path else Path.cwd()
    return (base / Path(raw).expanduser()).absolute()


@dataclass(frozen=True)
class NodeTable:
    """One `[[node]]` table, numbered from 1 in file order."""

    index: int
    table: Any  # a dict once `node_is_table` passed

    @property
    def label(self) -> str:
        return f"[[node]] #{self.index}"

    @property
    def name(self) -> str:
        return self.table["name"]  # a valid name once `node_name` passed

    @property
    def where(self) -> str:
        return f"node '{self.name}'"

    @property
    def dest(self) -> Any:
        return self.table.get("ssh")


@dataclass
class FleetCheck:
    """One validation of a parsed fleet file: what the rules read, and what they said."""

    file: str  # the fleet file, as diagnostics name it
    path: Path | None
    doc: dict[str, Any]
    said: list[Diagnostic] = field(default_factory=list)
    # the nodes kept so far, by name in file order: those no gate refused
    kept: dict[str, NodeTable] = field(default_factory=dict)

    @property
    def head(self) -> dict[str, Any]:
        """[fleet], or {} when it is not a table (a rule says so)."""
        head = self.doc.get("fleet", {})
        return head if isinstance(head, dict) else {}

    @property
    def node_tables(self) -> list[Any]:
        nodes = self.doc.get("node", [])
        return nodes if isinstance(nodes, list) else []

    @property
    def group_tables(self) -> dict[str, Any]:
        groups = self.doc.get("groups", {})
        return groups if isinstance(groups, dict) else {}

    def error(self, message: str, key: str | None = None, table: str | None = None) -> Diagnostic:
        return Diagnostic(ERROR, message, file=self.file, key=key, table=table)

    def warning(self, message: str, key: str | None = None, table: str | None = None) -> Diagnostic:
        return Diagnostic(WARNING, message, file=self.file, key=key, table=table)


Rule = Callable[[FleetCheck], Iterator[Diagnostic]]
NodeRule = Callable[[FleetCheck, NodeTable], Iterator[Diagnostic]]


def _allowed(keys: set[str]) -> str:
    return ", ".join(sorted(keys))


# -- the document and [fleet]


def unknown_top_keys(ctx: FleetCheck) -> Iterator[Diagnostic]:
    for key in sorted(set(ctx.doc) - TOP_KEYS):
        yield ctx.error(f"unknown table or key (allowed: {_allowed(TOP_KEYS)})", key=key)


def fleet_not_table(ctx: FleetCheck) -> Iterator[Diagnostic]:
    if not isinstance(ctx.doc.get("fleet", {}), dict):
        yield ctx.error("must be a table: [fleet]", key="fleet")


def unknown_fleet_keys(ctx: FleetCheck) -> Iterator[Diagnostic]:
    for key in sorted(set(ctx.head) - FLEET_KEYS):
        yield ctx.error(f"unknown key (allowed: {_allowed(FLEET_KEYS)})", key=key, table="[fleet]")


def bad_fleet_values(ctx: FleetCheck) -> Iterator[Diagnostic]:
    for f in FLEET_FIELDS.values():
        if why := f.refusal(ctx.head):
            yield ctx.error(why, key=f.key, table="[fleet]")


def ssh_config_not_a_file(ctx: FleetCheck) -> Iterator[Diagnostic]:
    found = ssh_config_path(ctx.head, ctx.path)
    if found is BAD:
        yield ctx.error(
            "must be a path (relative to the fleet file)", key="ssh_config", table="[fleet]"
        )
    elif found is not None and not found.is_file():
        yield ctx.error(f"{found} is not a file", key="ssh_config", table="[fleet]")


# -- the nodes


def nodes_not_list(ctx: FleetCheck) -> Iterator[Diagnostic]:
    if not isinstance(ctx.doc.get("node", []), list):
        yield ctx.error("write nodes as [[node]] tables", key="node")


def node_tables(ctx: FleetCheck) -> Iterator[Diagnostic]:
    """Every [[node]] table through NODE_RULES; those no gate refused are kept."""
    for index, table in enumerate(ctx.node_tables, 1):
        node = NodeTable(index, table)
        refused = False
        for rule, gate in NODE_RULES:
            found = list(rule(ctx, node))
            yield from found
            if gate and any(d.is_error for d in found):
                refused = True
                break
        if not refused:
            ctx.kept[node.name] = node


def node_is_table(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    if not isinstance(node.table, dict):
        yield ctx.error("must be a table", table=node.label)


def node_name(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    name = node.table.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        yield ctx.error(
            "every node needs a name: 1-64 letters, digits, '.', '_' or '-'",
            key="name",
            table=node.label,
        )


def unknown_node_keys(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    for key in sorted(set(node.table) - NODE_KEYS):
        yield ctx.error(f"unknown key (allowed: {_allowed(NODE_KEYS)})", key=key, table=node.where)


def node_name_twice(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    if node.name in ctx.kept:
        yield ctx.error(
            "a second node of this name; names must be unique", key="name", table=node.where
        )


def ssh_missing(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    if not isinstance(node.dest, str) or not node.dest:
        yield ctx.error(
            'missing: how to reach it, a Host alias or "user@host"', key="ssh", table=node.where
        )


def ssh_password(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    dest = node.dest
    if ":" in dest.removeprefix("ssh://").partition("@")[0] and "@" in dest:
        yield ctx.error(
            "holds a password (user:password@host); authentication belongs to SSH "
            "(keys, an agent), never in this file",
            key="ssh",
            table=node.where,
        )


def ssh_port(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    dest = node.dest
    bare = dest.removeprefix("ssh://").rpartition("@")[2]
    if not dest.startswith("ssh://") and re.fullmatch(r"[^:\[\]]+:\d+", bare):
        yield ctx.error(
            f"{dest!r}: ssh takes no :PORT here; write ssh://{dest} or a Host alias with Port",
            key="ssh",
            table=node.where,
        )


def ssh_not_destination(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    dest = node.dest
    if not DEST_RE.match(dest) or dest.startswith("-"):
        yield ctx.error(
            f"{dest!r} is not an ssh destination: a Host alias, user@host or ssh://user@host:port",
            key="ssh",
            table=node.where,
        )


def ssh_shared(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    twin = next((k.name for k in ctx.kept.values() if k.dest == node.dest), None)
    if twin is not None:
        yield ctx.warning(
            f"the same ssh destination as node '{twin}'; fine only if their homes differ",
            key="ssh",
            table=node.where,
        )


def bad_node_values(ctx: FleetCheck, node: NodeTable) -> Iterator[Diagnostic]:
    for f in NODE_FIELDS.values():
        if why := f.refusal(node.table):
            yield ctx.error(why, key=f.key, table=node.where)


# (rule, gate): a gate's error drops the node
NODE_RULES: tuple[tuple[NodeRule, bool], ...] = (
    (node_is_table, True),
    (node_name, True),
    (unknown_node_keys, False),
    (node_name_twice, True),
    (ssh_missing, True),
    (ssh_password, True),
    (ssh_port, True),
    (ssh_not_destination, True),
    (ssh_shared, False),
    (bad_node_values, False),
)


def no_nodes(ctx: FleetCheck) -> Iterator[Diagnostic]:
    """Said only of a file with nothing else wrong: a node refused is its own error."""
    if not ctx.kept and not any(d.is_error for d in ctx.said):
        yield ctx.error("no nodes: add [[node]] tables with name and ssh", key="node")


# -- the groups


def _group_list(name: str, members: Any) -> bool:
    return (
        bool(NAME_RE.match(name))
        and isinstance(members, list)
        and all(isinstance(m, str) for m in members)
    )


def fleet_groups(ctx: FleetCheck) -> dict[str, tuple[str, ...]]:
    """Group -> the kept nodes in it: those naming it in `groups`, in file order, then those
    [groups] adds. A group with no kept node in it is no group."""
    out: dict[str, list[str]] = {}
    for name, node in ctx.kept.items():
        for g in NODE_FIELDS["groups"].value(node.table):
            out.setdefault(g, []).append(name)
    for g, members in ctx.group_tables.items():
        if not _group_list(g, members):
            continue
        for m in members:
            if m in ctx.kept and m not in out.setdefault(g, []):
                out[g].append(m)
    return {g: tuple(m) for g, m in out.items()}


def groups_not_table(ctx: FleetCheck) -> Iterator[Diagnostic]:
    if not isinstance(ctx.doc.get("groups", {}), dict):
        yield ctx.error("must be a table of group = [node names]", key="groups")


def group_members(ctx: FleetCheck) -> Iterator[Diagnostic]:
    for g, members in ctx.group_tables.items():
        if not _group_list(g, members):
            yield ctx.error("must be a list of node names", key=f"groups.{g}")
            continue
        for m in members:
            if m not in ctx.kept:
                yield ctx.error(
                    f"names node {m!r}, which the file does not have", key=f"groups.{g}"
                )


def group_named_like_node(ctx: FleetCheck) -> Iterator[Diagnostic]:
    for g in sorted(set(fleet_groups(ctx)) & set(ctx.kept)):
        yield ctx.warning(
            "a group and a node of the same name: --group and --nodes tell them apart",
            key=f"groups.{g}",
        )


RULES: tuple[Rule, ...] = (
    unknown_top_keys,
    fleet_not_table,
    unknown_fleet_keys,
    bad_fleet_values,
    ssh_config_not_a_file,
    nodes_not_list,
    node_tables,
    no_nodes,
    groups_not_table,
    group_members,
    group_named_like_node,
)


def check(ctx: FleetCheck) -> list[Diagnostic]:
    """Every rule's diagnostics, in the order the rules run (a rule may read what was said
    before it, and the nodes kept)."""
    for rule in RULES:
        ctx.said.extend(rule(ctx))
    return ctx.said
