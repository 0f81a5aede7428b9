"""The same vLLM on every node of a server across nodes, checked before `vsup fleet up` starts
one (docs/fleet.md, "Started through each node's daemon"), over the nodes' `vsup paths --json`
answers: the shape is the real command's (`vsup.commands.paths.describe()` on this machine),
each node's version then set as a node with another vLLM would answer it."""

from __future__ import annotations

from typing import Any

from vsup.commands.paths import describe
from vsup.fleet.units import PathsAnswer, vllm_versions


def paths_of(version: str | None) -> dict[str, Any]:
    doc = dict(describe())
    assert set(doc) == {"home", "socket", "daemon", "version", "vllm_version", "python"}
    doc["vllm_version"] = version
    return doc


def test_the_same_version_on_every_node_lets_the_unit_start():
    answers: dict[str, PathsAnswer] = {
        "gpu01": paths_of("0.32.0+cpu"),
        "gpu02": paths_of("0.32.0+cpu"),
        "n3": "down",
    }
    check = vllm_versions([("big", ("gpu01", "gpu02"))], answers)
    assert check.ok and check.bad == () and check.unreachable == ()


def test_another_version_on_one_node_names_the_instance_the_nodes_and_their_versions():
    answers = {
        "gpu01": paths_of("0.32.0"),
        "gpu02": paths_of("0.31.1"),
        "gpu03": paths_of("0.32.0"),
    }
    check = vllm_versions([("big", ("gpu01", "gpu02", "gpu03"))], answers)
    assert not check.ok and check.unreachable == ()
    (line,) = check.bad
    assert line.startswith("instance big: its nodes run different vLLM versions "), line
    assert "(gpu01 0.32.0, gpu02 0.31.1, gpu03 0.32.0)" in line, line


def test_a_node_with_no_vllm_known_is_said_with_its_python():
    answers = {"gpu01": paths_of("0.32.0"), "gpu02": paths_of(None)}
    check = vllm_versions([("big", ("gpu01", "gpu02"))], answers)
    (line,) = check.bad
    assert line.startswith("instance big: no vLLM version known on gpu02"), line
    assert answers["gpu02"]["python"] in line


def test_a_node_that_cannot_be_asked_is_unreachable_not_bad_input():
    answers: dict[str, PathsAnswer] = {
        "gpu01": paths_of("0.32.0"),
        "gpu02": "ssh gpu02: Connection refused",
    }
    check = vllm_versions([("big", ("gpu01", "gpu02"))], answers)
    assert check.bad == ()
    assert check.unreachable == (
        "instance big: cannot ask gpu02 which vLLM it runs: ssh gpu02: Connection refused",
    )


def test_each_span_is_checked_on_its_own_nodes():
    answers = {n: paths_of(v) for n, v in (("a", "1"), ("b", "1"), ("c", "2"), ("d", "2"))}
    assert vllm_versions([("x", ("a", "b")), ("y", ("c", "d"))], answers).ok
    check = vllm_versions([("x", ("a", "c"))], answers)
    assert check.bad and "instance x" in check.bad[0] and "(a 1, c 2)" in check.bad[0]


def test_what_a_node_says_is_made_safe_for_a_terminal():
    answers = {"gpu01": paths_of("0.32.0"), "gpu02": paths_of("0.32\x1b[2J")}
    (line,) = vllm_versions([("big", ("gpu01", "gpu02"))], answers).bad
    assert "\x1b" not in line
