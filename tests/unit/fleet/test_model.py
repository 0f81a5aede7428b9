"""The fleet file: what `vsup fleet validate` accepts and what it refuses, each refusal naming
the file, the node and the key; and the remote command line built from a node."""

from __future__ import annotations

import shlex

import pytest

from vsup.fleet.model import load_fleet, loads_fleet
from vsup.fleet.transport import ssh_error


def errors(text: str) -> list[str]:
    return [d.format() for d in loads_fleet(text).errors]


def test_the_minimal_form_and_groups():
    fleet = loads_fleet(
        """
[[node]]
name = "gpu01"
ssh = "ops@gpu01.example"
groups = ["rack1"]

[[node]]
name = "gpu02"
ssh = "gpu02"
home = "/srv/vsup"
vsup = "/opt/vsup/bin/vsup"

[groups]
rack1 = ["gpu02"]
"""
    )
    assert fleet.ok, [d.format() for d in fleet.errors]
    assert [n.name for n in fleet.nodes] == ["gpu01", "gpu02"]
    assert fleet.groups == {"rack1": ("gpu01", "gpu02")}
    assert fleet.node("gpu01").vsup == ("vsup",) and fleet.node("gpu01").home is None
    assert [n.name for n in fleet.select(group="rack1")] == ["gpu01", "gpu02"]
    assert [n.name for n in fleet.select(["gpu02", "gpu01"])] == ["gpu02", "gpu01"]
    with pytest.raises(KeyError, match="no node gpu09"):
        fleet.select(["gpu09"])
    with pytest.raises(KeyError, match="no group 'rack2'"):
        fleet.select(group="rack2")


def test_the_remote_command_is_quoted_word_by_word():
    fleet = loads_fleet(
        '[[node]]\nname = "a"\nssh = "a"\nhome = "/srv/my vsup"\nvsup = ["/opt/py", "-m", "vsup"]\n'
    )
    cmd = fleet.nodes[0].remote_command("paths", "--json")
    assert shlex.split(cmd) == [
        "env",
        "VSUP_HOME=/srv/my vsup",
        "/opt/py",
        "-m",
        "vsup",
        "paths",
        "--json",
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[[node]]\nname = "a"\nssh = "root:hunter2@a"\n', "holds a password"),
        ('[[node]]\nname = "a"\nssh = "-oProxyCommand=x"\n', "is not an ssh destination"),
        ('[[node]]\nname = "a"\nssh = "root@a:2222"\n', "write ssh://root@a:2222"),
        ('[[node]]\nname = "a"\n', "key 'ssh': missing"),
        ('[[node]]\nname = "a"\nssh = "a"\nhome = "relative"\n', "key 'home': must be an absolute"),
        ('[[node]]\nname = "a"\nssh = "a"\npassword = "x"\n', "key 'password': unknown key"),
        ('[[node]]\nname = "a"\nssh = "a"\n[[node]]\nname = "a"\nssh = "b"\n', "a second node"),
        ('[fleet]\ntimeout_s = 0\n[[node]]\nname = "a"\nssh = "a"\n', "key 'timeout_s'"),
        ('[groups]\nr = ["zz"]\n[[node]]\nname = "a"\nssh = "a"\n', "names node 'zz'"),
        ("[fleet\n", "not valid TOML"),
        ("", "no nodes"),
    ],
)
def test_bad_fleet_files_are_refused_naming_node_and_key(text, said):
    found = errors(text)
    assert any(said in e for e in found), found
    assert all(e.startswith("<fleet>") for e in found)


def test_a_missing_file_names_itself(tmp_path):
    fleet = load_fleet(tmp_path / "nope.toml")
    said = fleet.errors[0].format()
    assert not fleet.ok and str(tmp_path / "nope.toml") in said and "--fleet FILE" in said


def test_ssh_errors_keep_ssh_own_words():
    banner = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Offending ED25519 key in /home/op/.ssh/known_hosts:3
Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.
Host key verification failed.
"""
    said = ssh_error(banner)
    assert said.startswith("WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!")
    assert "known_hosts:3" in said and said.endswith("Host key verification failed.")
    assert ssh_error("ssh: connect to host x port 22: Connection refused\n") == (
        "connect to host x port 22: Connection refused"
    )
