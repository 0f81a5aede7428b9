"""The fleet file's rules (vsup.fleet.rules): every message word for word and in the order said,
as `vsup fleet validate` prints them, and the one Diagnostic type the layout reports with too."""

from __future__ import annotations

from pathlib import Path

import pytest

from vsup.diagnostics import Diagnostic
from vsup.fleet import rules
from vsup.fleet.model import loads_fleet

ALLOWED_NODE_KEYS = "unknown key (allowed: groups, home, metrics_host, name, ssh, vsup)"
SECONDS = "must be a number of seconds, more than 0 and at most 600"
NEEDS_NAME = "every node needs a name: 1-64 letters, digits, '.', '_' or '-'"
COMMAND = 'must be the remote command: a string ("vsup") or a list of words'
NOT_DEST = "is not an ssh destination: a Host alias, user@host or ssh://user@host:port"
PASSWORD = (
    "holds a password (user:password@host); authentication belongs to SSH (keys, an agent), "
    "never in this file"
)
MISSING_SSH = 'missing: how to reach it, a Host alias or "user@host"'
SAME_NAME = "a group and a node of the same name: --group and --nodes tell them apart"

CASES = {
    "top and [fleet]": (
        "x = 1\n[fleet]\nnam = 1\nname = 3\ntimeout_s = true\nconnect_timeout_s = 700\n"
        'ssh_config = ""\n[[node]]\nname = "a"\nssh = "a"\n',
        [
            "error: key 'x': unknown table or key (allowed: fleet, groups, node)",
            "error: [fleet]: key 'nam': unknown key (allowed: connect_timeout_s, name, "
            "ssh_config, timeout_s)",
            "error: [fleet]: key 'name': must be a string",
            f"error: [fleet]: key 'timeout_s': {SECONDS}",
            f"error: [fleet]: key 'connect_timeout_s': {SECONDS}",
            "error: [fleet]: key 'ssh_config': must be a path (relative to the fleet file)",
        ],
    ),
    "not tables": (
        "fleet = 3\nnode = 3\ngroups = 3\n",
        [
            "error: key 'fleet': must be a table: [fleet]",
            "error: key 'node': write nodes as [[node]] tables",
            "error: key 'groups': must be a table of group = [node names]",
        ],
    ),
    "a node that is not a table": ("node = [1]\n", ["error: [[node]] #1: must be a table"]),
    "node names": (
        '[[node]]\nssh = "a"\n[[node]]\nname = "bad name"\nssh = "b"\n',
        [
            f"error: [[node]] #1: key 'name': {NEEDS_NAME}",
            f"error: [[node]] #2: key 'name': {NEEDS_NAME}",
        ],
    ),
    "a node refused at its first gate": (
        '[[node]]\nname = "a"\nssh = "a"\n[[node]]\nname = "a"\nssh = "b"\npassword = 1\n'
        '[[node]]\nname = "b"\n[[node]]\nname = "c"\nssh = "root:pw@c"\nhome = 3\n'
        '[[node]]\nname = "d"\nssh = "root@d:2222"\n[[node]]\nname = "e"\nssh = "-oProxy=x"\n',
        [
            f"error: node 'a': key 'password': {ALLOWED_NODE_KEYS}",
            "error: node 'a': key 'name': a second node of this name; names must be unique",
            f"error: node 'b': key 'ssh': {MISSING_SSH}",
            f"error: node 'c': key 'ssh': {PASSWORD}",
            "error: node 'd': key 'ssh': 'root@d:2222': ssh takes no :PORT here; write "
            "ssh://root@d:2222 or a Host alias with Port",
            f"error: node 'e': key 'ssh': '-oProxy=x' {NOT_DEST}",
        ],
    ),
    "bad values, a shared destination": (
        '[[node]]\nname = "a"\nssh = "h"\nhome = "rel"\nvsup = []\ngroups = "g"\n'
        'metrics_host = ""\n[[node]]\nname = "b"\nssh = "h"\nvsup = ["x", 1]\n',
        [
            "error: node 'a': key 'home': must be an absolute path on the node (or start with ~)",
            f"error: node 'a': key 'vsup': {COMMAND}",
            "error: node 'a': key 'groups': must be a list of group names",
            "error: node 'a': key 'metrics_host': must be a host name or address",
            f"error: node 'b': key 'vsup': {COMMAND}",
            "warning: node 'b': key 'ssh': the same ssh destination as node 'a'; fine only if "
            "their homes differ",
        ],
    ),
    "groups": (
        '[[node]]\nname = "a"\nssh = "a"\ngroups = ["b"]\n[[node]]\nname = "b"\nssh = "b"\n'
        '[groups]\na = ["b"]\n"bad name" = ["a"]\nr = "a"\nt = ["zz", "a"]\n',
        [
            "error: key 'groups.bad name': must be a list of node names",
            "error: key 'groups.r': must be a list of node names",
            "error: key 'groups.t': names node 'zz', which the file does not have",
            f"warning: key 'groups.a': {SAME_NAME}",
            f"warning: key 'groups.b': {SAME_NAME}",
        ],
    ),
    "no nodes": (
        '[fleet]\nname = "x"\n',
        ["error: key 'node': no nodes: add [[node]] tables with name and ssh"],
    ),
    "TOML": (
        "[fleet\n",
        [
            "error: not valid TOML: Expected ']' at the end of a table declaration "
            "(at line 1, column 7)"
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_message_word_for_word_in_the_order_said(case: str):
    text, said = CASES[case]
    fleet = loads_fleet(text, Path("/srv/fleet.toml"))
    where = "/srv/fleet.toml:1: " if case == "TOML" else "/srv/fleet.toml: "
    assert [d.format() for d in fleet.errors + fleet.warnings] == [where + s for s in said]
    assert [d.is_error for d in fleet.errors] == [True] * len(fleet.errors)
    assert not any(d.is_error for d in fleet.warnings)


def test_the_nodes_kept_are_those_no_gate_refused():
    fleet = loads_fleet(CASES["a node refused at its first gate"][0])
    assert [(n.name, n.ssh) for n in fleet.nodes] == [("a", "a")]
    fleet = loads_fleet(CASES["bad values, a shared destination"][0])
    # a bad value is said and read as the key's default; the node stays
    a, b = fleet.nodes
    assert (a.home, a.vsup, a.groups, a.metrics_host) == (None, ("vsup",), (), None)
    assert (b.ssh, b.vsup) == ("h", ("vsup",))
    groups = loads_fleet(CASES["groups"][0]).groups
    assert groups == {"b": ("a",), "a": ("b",), "t": ("a",)}


def test_an_ssh_config_that_is_no_file_is_named_where_it_was_looked_for(tmp_path: Path):
    fleet = loads_fleet(
        '[fleet]\nssh_config = "nope/cfg"\n[[node]]\nname = "a"\nssh = "a"\n',
        tmp_path / "fleet.toml",
    )
    want = f"{tmp_path}/fleet.toml: error: [fleet]: key 'ssh_config': {tmp_path}/nope/cfg is not a file"
    assert [d.format() for d in fleet.errors] == [want]
    assert fleet.ssh_config == tmp_path / "nope" / "cfg"


def test_fleet_and_layout_report_with_one_diagnostic_type():
    from vsup.layout import Diagnostic as LayoutDiagnostic
    from vsup.layout import loads_layout

    fleet_said = loads_fleet("").errors[0]
    layout_said = loads_layout("[layout\n").load_errors[0]
    assert type(fleet_said) is type(layout_said) is Diagnostic is LayoutDiagnostic
    # the same JSON shape in `vsup fleet validate --json` and `vsup validate --json`
    assert fleet_said.to_json().keys() == layout_said.to_json().keys()


def test_every_rule_is_in_a_table():
    """A rule function written but not listed would never run."""
    listed = set(rules.RULES) | {rule for rule, _ in rules.NODE_RULES}
    helpers = {rules.check, rules.fleet_groups, rules.ssh_config_path}
    written = {
        f
        for name, f in vars(rules).items()
        if callable(f)
        and getattr(f, "__module__", None) == rules.__name__
        and not name.startswith("_")
        and not isinstance(f, type)
    }
    assert written - helpers == listed


def test_a_remote_command_with_an_unclosed_quote_is_an_error_not_a_crash():
    """`load_fleet` never raises for bad input: shlex's ValueError became a traceback."""
    fleet = loads_fleet('[[node]]\nname = "a"\nssh = "a"\nvsup = "\'/opt/my vsup"\n')
    assert [d.format() for d in fleet.errors] == [
        "<fleet>: error: node 'a': key 'vsup': \"'/opt/my vsup\" cannot be split into words "
        "(No closing quotation): close the quote, or write the words as a list"
    ]
    assert fleet.node("a").vsup == ("vsup",)
