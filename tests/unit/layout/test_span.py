"""One server across nodes (`span`, docs/fleet.md "One server across nodes"): the table read,
each node's exact command line, and every refusal naming the file, the instance and the key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.diagnostics import Diagnostic
from vsup.layout.compiled import compile_document, span_units
from vsup.layout.model import load_layout
from vsup.layout.span import SpanUnit, fleet_problems, read_span, serve_command
from vsup.layout.validate import validate

CPU = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
SHIM = (sys.executable, "-m", "vsup.vllmserve", "serve")


def layout_text(span: str, *, gpus: str = "[]", args: str = "", extra: str = "") -> str:
    command = json.dumps(CPU)
    return (
        '[layout]\nname = "spanned"\n\n[[instance]]\nname = "big"\n'
        f'model = "acme/tiny-model"\ncommand = {command}\ngpus = {gpus}\nport = 8000\n'
        f"args = {{ {args} }}\n{extra}span = {span}\n"
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spanned.toml"
    path.write_text(text)
    return path


def units_of(tmp_path: Path, text: str) -> list[SpanUnit]:
    units, diagnostics = span_units(load_layout(write(tmp_path, text)))
    assert not [d.format() for d in diagnostics if d.is_error]
    return units


def errors_of(tmp_path: Path, text: str) -> list[Diagnostic]:
    path = write(tmp_path, text)
    return [d for d in validate(load_layout(path), node_gpus=8) if d.is_error]


def warnings_of(tmp_path: Path, text: str) -> list[Diagnostic]:
    path = write(tmp_path, text)
    return [d for d in validate(load_layout(path), node_gpus=8) if not d.is_error]


def one(found: list[Diagnostic], key: str, tmp_path: Path, words: str = "") -> Diagnostic:
    """The one diagnostic of `key` (saying `words`); it names the layout file and the
    instance."""
    hits = [d for d in found if d.key == key and words in d.message]
    assert len(hits) == 1, [d.format() for d in found]
    d = hits[0]
    assert d.file == str(tmp_path / "spanned.toml")
    assert d.instance == "big"
    assert d.line is not None
    return d


# -- the table read --------------------------------------------------------------------------


def test_ranks_count_from_the_head_then_the_others_in_the_order_written():
    span = read_span({"ranks": {"a": 2, "b": 1, "c": 3}, "head": "b", "address": "10.0.0.1"})
    assert span is not None
    assert span.ranks == (("b", 1), ("a", 2), ("c", 3))
    assert (span.head, span.size, span.rpc_port) == ("b", 6, 29550)
    assert [span.start_rank(n) for n in ("b", "a", "c")] == [0, 1, 3]


def test_the_head_is_the_first_node_when_not_named():
    span = read_span({"ranks": {"n1": 1, "n2": 1}, "address": "h", "rpc_port": 13345})
    assert span is not None and span.head == "n1" and span.rpc_port == 13345


def test_an_unusable_table_reads_as_none():
    assert read_span({"ranks": {"a": 0, "b": 1}, "address": "h"}) is None
    assert read_span({"ranks": {"a": 1}, "head": "z", "address": "h"}) is None
    assert read_span({"ranks": {"a": 1, "b": 1}}) is None
    assert read_span(None) is None


# -- each node's command line ----------------------------------------------------------------


def test_two_nodes_one_rank_each_exact_argv(tmp_path: Path):
    span = '{ ranks = { n1 = 1, n2 = 1 }, address = "127.0.0.1", rpc_port = 13345 }'
    (unit,) = units_of(tmp_path, layout_text(span, args="enforce-eager = true"))
    head, follower = unit.members()
    common = [
        "acme/tiny-model",  # vllm serve's positional model
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--enforce-eager",
        "--data-parallel-size",
        "2",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        "13345",
    ]
    # the API-server module has no --headless: both run vsup's shim of `vllm serve`
    load = ["--enable-server-load-tracking"] if unit.spec.load_tracking else []
    common = common[:5] + load + common[5:]
    assert head.argv() == [*SHIM, *common]
    assert follower.argv() == [*SHIM, *common, "--headless", "--data-parallel-start-rank", "1"]
    assert (head.node, head.head, head.start_rank, head.describe()) == (
        "n1",
        True,
        0,
        "head, rank 0",
    )
    assert (follower.node, follower.head, follower.describe()) == ("n2", False, "rank 1")
    assert unit.member("n2") == follower


def test_two_nodes_two_ranks_each_on_gpus(tmp_path: Path):
    """TP1 ranks on 2 GPUs per node: DP 4, 2 local, the follower from rank 2."""
    text = layout_text(
        '{ ranks = { gpu01 = 2, gpu02 = 2 }, address = "10.0.0.1" }', gpus="[0, 1]"
    ).replace(json.dumps(CPU), '["vllm", "serve"]')
    (unit,) = units_of(tmp_path, text)
    head, follower = unit.members()
    common = [
        "vllm",
        "serve",
        "acme/tiny-model",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    dp = [
        "--data-parallel-size",
        "4",
        "--data-parallel-size-local",
        "2",
        "--data-parallel-address",
        "10.0.0.1",
        "--data-parallel-rpc-port",
        "29550",
    ]
    load = ["--enable-server-load-tracking"] if unit.spec.load_tracking else []
    assert head.argv() == [*common, *load, *dp]
    assert follower.argv() == [*common, *load, *dp, "--headless", "--data-parallel-start-rank", "2"]
    assert head.spec.gpus == follower.spec.gpus == (0, 1)
    assert (head.describe(), follower.describe()) == ("head, ranks 0-1", "ranks 2-3")


def test_three_nodes_uneven_ranks_and_tp_per_rank(tmp_path: Path):
    """TP2 ranks: 2 + 2 + 1 ranks; `gpus` holds the biggest node's part (4 GPUs), the node with
    one rank runs on the first two; the head named last in the table still gets rank 0."""
    text = layout_text(
        '{ ranks = { b = 2, c = 1, a = 2 }, head = "a", address = "10.0.0.9", rpc_port = 13000 }',
        gpus="[0, 1, 2, 3]",
        args="tensor-parallel-size = 2",
    ).replace(json.dumps(CPU), '["vllm", "serve"]')
    (unit,) = units_of(tmp_path, text)
    by_node = {m.node: m for m in unit.members()}
    assert [m.node for m in unit.members()] == ["a", "b", "c"]
    tail = lambda local: [  # noqa: E731
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "5",
        "--data-parallel-size-local",
        str(local),
        "--data-parallel-address",
        "10.0.0.9",
        "--data-parallel-rpc-port",
        "13000",
    ]
    assert by_node["a"].argv()[-len(tail(2)) :] == tail(2)
    assert by_node["b"].argv()[-len(tail(2)) - 3 :] == [
        *tail(2),
        "--headless",
        "--data-parallel-start-rank",
        "2",
    ]
    assert by_node["c"].argv()[-len(tail(1)) - 3 :] == [
        *tail(1),
        "--headless",
        "--data-parallel-start-rank",
        "4",
    ]
    assert [by_node[n].spec.gpus for n in "abc"] == [(0, 1, 2, 3), (0, 1, 2, 3), (0, 1)]
    assert "--headless" not in by_node["a"].argv()


def test_three_nodes_tp_derived_from_the_gpus(tmp_path: Path):
    """Without tensor-parallel-size: 8 GPUs over the biggest node's 4 ranks is TP2 per rank,
    also on the node with fewer ranks (its part is fewer GPUs, not smaller ranks)."""
    text = layout_text(
        '{ ranks = { a = 4, b = 4, c = 2 }, address = "10.0.0.9" }', gpus="[0, 1, 2, 3, 4, 5, 6, 7]"
    ).replace(json.dumps(CPU), '["vllm", "serve"]')
    (unit,) = units_of(tmp_path, text)
    c = unit.member("c")
    argv = c.argv()
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--data-parallel-start-rank") + 1] == "8"
    assert c.spec.gpus == (0, 1, 2, 3)
    assert c.spec.parallel.tp == 2 and c.spec.parallel.dp == 10


def test_serve_command_maps_only_the_api_server_module():
    assert serve_command(CPU) == SHIM
    assert serve_command(["vllm", "serve"]) == ("vllm", "serve")
    assert serve_command(["/opt/v/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"]) == (
        "/opt/v/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
    )


def test_a_node_the_span_does_not_name_has_no_part(tmp_path: Path):
    (unit,) = units_of(tmp_path, layout_text('{ ranks = { n1 = 1, n2 = 1 }, address = "h" }'))
    with pytest.raises(KeyError):
        unit.member("n3")


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "key", "words"),
    [
        ('{ address = "h" }', "span.ranks", "missing"),
        ('{ ranks = {}, address = "h" }', "span.ranks", "missing"),
        ('{ ranks = { n1 = 1 }, address = "h" }', "span.ranks", "names one node"),
        ('{ ranks = { n1 = 0, n2 = 1 }, address = "h" }', "span.ranks.n1", "1 or more"),
        ('{ ranks = { n1 = 1, n2 = "two" }, address = "h" }', "span.ranks.n2", "1 or more"),
        ('{ ranks = { "-x" = 1, n2 = 1 }, address = "h" }', "span.ranks.-x", "not a node name"),
        ('{ ranks = { n1 = 1, n2 = 1 }, head = "n3", address = "h" }', "span.head", "'n3'"),
        ("{ ranks = { n1 = 1, n2 = 1 } }", "span.address", "missing"),
        ('{ ranks = { n1 = 1, n2 = 1 }, address = "a b" }', "span.address", "not a host"),
        ('{ ranks = { n1 = 1, n2 = 1 }, address = "h:13345" }', "span.address", "rpc_port"),
        ('{ ranks = { n1 = 2, n2 = 1 }, address = "h", size = 4 }', "span.size", "add up to 3"),
        ('{ ranks = { n1 = 1, n2 = 1 }, address = "h", rpc_port = 70000 }', "span.rpc_port", ""),
        ('{ ranks = { n1 = 1, n2 = 1 }, address = "h", rpc_port = 8000 }', "span.rpc_port", "8000"),
        ('{ ranks = { n1 = 1, n2 = 1 }, adress = "h" }', "span.adress", "address"),
        ('{ ranks = [1, 1], address = "h" }', "span.ranks", "table"),
    ],
)
def test_a_bad_span_names_file_instance_and_key(
    tmp_path: Path, span: str, key: str, words: str
) -> None:
    d = one(errors_of(tmp_path, layout_text(span)), key, tmp_path)
    assert words in d.message


SPAN = '{ ranks = { n1 = 1, n2 = 1 }, address = "h" }'


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ("data-parallel-size = 2", "args.data-parallel-size"),
        ("data-parallel-size-local = 1", "args.data-parallel-size-local"),
        ('data-parallel-address = "h"', "args.data-parallel-address"),
        ("data-parallel-rpc-port = 13345", "args.data-parallel-rpc-port"),
        ("headless = true", "args.headless"),
        ("data-parallel-start-rank = 1", "args.data-parallel-start-rank"),
        ('data-parallel-backend = "ray"', "args.data-parallel-backend"),
    ],
)
def test_a_data_parallel_flag_beside_the_span_is_refused(tmp_path: Path, args: str, key: str):
    d = one(errors_of(tmp_path, layout_text(SPAN, args=args)), key, tmp_path)
    assert "span" in d.message


def test_gpus_must_hold_the_biggest_nodes_part(tmp_path: Path):
    text = layout_text(
        '{ ranks = { n1 = 2, n2 = 1 }, address = "h" }',
        gpus="[0, 1, 2]",
        args="tensor-parallel-size = 1",
    )
    d = one(errors_of(tmp_path, text), "args.tensor-parallel-size", tmp_path)
    assert "data-parallel-size-local 2" in d.message and "needs 2 GPU(s)" in d.message


def test_a_relative_model_sleep_and_swap_group_are_refused(tmp_path: Path):
    (tmp_path / "m").mkdir()
    text = layout_text(SPAN, extra='sleep = { level = 1 }\nswap_group = "g"\n').replace(
        '"acme/tiny-model"', '"./m"'
    )
    found = errors_of(tmp_path, text)
    assert "every node" in one(found, "model", tmp_path, "hub id").message
    assert "not supported" in one(found, "sleep", tmp_path).message
    assert "not supported" in one(found, "swap_group", tmp_path).message


def test_span_is_set_per_instance(tmp_path: Path):
    text = layout_text(SPAN).replace("[[instance]]", f"[defaults]\nspan = {SPAN}\n\n[[instance]]")
    found = errors_of(tmp_path, text)
    hits = [d for d in found if d.key == "span" and d.table == "[defaults]"]
    assert hits and "per instance" in hits[0].message


def test_a_loopback_address_and_a_command_without_headless_are_warnings(tmp_path: Path):
    text = layout_text('{ ranks = { n1 = 1, n2 = 1 }, address = "127.0.0.1" }').replace(
        json.dumps(CPU), '["/opt/wrap-vllm"]'
    )
    assert not errors_of(tmp_path, text)
    found = warnings_of(tmp_path, text)
    assert "loopback" in one(found, "span.address", tmp_path).message
    assert "vllm serve" in one(found, "command", tmp_path, "--headless").message


def test_a_node_that_does_not_know_its_name_refuses_a_span(tmp_path: Path):
    """Which part runs depends on the node: a compile without `[layout] node` (a node's own
    `vsup up`) refuses the layout, naming the file, the instance and the key, and says how."""
    compiled, diagnostics = compile_document(load_layout(write(tmp_path, layout_text(SPAN))))
    assert compiled is None
    d = one([d for d in diagnostics if d.is_error], "span", tmp_path)
    assert "vsup fleet up" in d.message and "[layout] node" in d.message


def test_nodes_the_fleet_lacks_name_the_layout_instance_and_key(tmp_path: Path):
    units = units_of(tmp_path, layout_text('{ ranks = { n1 = 1, n9 = 1 }, address = "h" }'))
    layout_file = str(tmp_path / "spanned.toml")
    declared = [u.declared for u in units]
    (d,) = fleet_problems(declared, ["n1", "n2"], "/etc/fleet.toml", layout_file)
    assert (d.file, d.instance, d.key) == (layout_file, "big", "span.ranks.n9")
    assert "no node 'n9' in /etc/fleet.toml (nodes: n1, n2)" in d.message


# -- vsup fleet validate LAYOUT --------------------------------------------------------------

FLEET = '[[node]]\nname = "n1"\nssh = "n1"\n\n[[node]]\nname = "n2"\nssh = "n2"\n'


def test_fleet_validate_shows_each_nodes_command(tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "fleet.toml").write_text(FLEET)
    layout = write(tmp_path, layout_text(SPAN))
    fleet = str(tmp_path / "fleet.toml")
    assert main(["fleet", "validate", "--fleet", fleet, str(layout)]) == 0
    out = capsys.readouterr().out
    assert "instance big: one server over 2 nodes, 2 data-parallel ranks, head n1" in out
    (head,) = [line for line in out.splitlines() if line.startswith("  n1 (head, rank 0): ")]
    (follower,) = [line for line in out.splitlines() if line.startswith("  n2 (rank 1): ")]
    assert "-m vsup.vllmserve serve" in head and "--headless" not in head
    assert follower.endswith("--headless --data-parallel-start-rank 1")

    assert main(["fleet", "validate", "--fleet", fleet, "--json", str(layout)]) == 0
    doc = json.loads(capsys.readouterr().out)["layout"]
    members = doc["spans"][0]["members"]
    assert [(m["node"], m["start_rank"], m["head"]) for m in members] == [
        ("n1", 0, True),
        ("n2", 1, False),
    ]
    assert members[1]["argv"][-3:] == ["--headless", "--data-parallel-start-rank", "1"]


def test_fleet_validate_refuses_a_node_the_fleet_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    (tmp_path / "fleet.toml").write_text(FLEET)
    layout = write(tmp_path, layout_text('{ ranks = { n1 = 1, gpu7 = 1 }, address = "h" }'))
    code = main(["fleet", "validate", "--fleet", str(tmp_path / "fleet.toml"), str(layout)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{layout}:" in err
    assert "instance 'big': key 'span.ranks.gpu7': no node 'gpu7'" in err
    assert "is not valid" in err


def test_fleet_validate_says_every_error_at_once(tmp_path: Path, capsys: pytest.CaptureFixture):
    """A node the fleet lacks is said beside the layout's other errors, not after they are
    fixed."""
    (tmp_path / "fleet.toml").write_text(FLEET)
    text = layout_text('{ ranks = { n1 = 1, gpu7 = 1 }, address = "h" }', args="headless = true")
    layout = write(tmp_path, text)
    code = main(["fleet", "validate", "--fleet", str(tmp_path / "fleet.toml"), str(layout)])
    assert code == 2
    err = capsys.readouterr().err
    assert "key 'span.ranks.gpu7': no node 'gpu7'" in err
    assert "key 'args.headless': --headless is set by span" in err


def test_fleet_up_refuses_a_span_whose_nodes_are_not_all_chosen(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A unit starts whole or not at all: `fleet up` of only some of its nodes says which is
    missing and reaches no node (these nodes' ssh names resolve nowhere)."""
    (tmp_path / "fleet.toml").write_text(FLEET)
    layout = write(tmp_path, layout_text(SPAN))
    fleet = str(tmp_path / "fleet.toml")
    assert main(["fleet", "up", "--fleet", fleet, "--nodes", "n1", str(layout)]) == 2
    err = capsys.readouterr().err
    assert "instance 'big': key 'span.ranks.n2': node 'n2' runs part of this server" in err
    assert "nothing was changed" in err
    assert "cannot take part" not in err


def test_a_command_that_may_not_be_vllm_serve_keeps_the_model_option(tmp_path: Path):
    """Only `vllm serve` forms take the model as their positional argument."""
    text = layout_text(SPAN).replace(json.dumps(CPU), '["/opt/wrap-vllm"]')
    (unit,) = units_of(tmp_path, text)
    assert unit.member("n2").argv()[:3] == ["/opt/wrap-vllm", "--model", "acme/tiny-model"]


def test_three_nodes_one_rank_each_exact_argv(tmp_path: Path):
    text = layout_text('{ ranks = { n1 = 1, n2 = 1, n3 = 1 }, address = "10.1.2.3" }').replace(
        json.dumps(CPU), '["vllm", "serve"]'
    )
    (unit,) = units_of(tmp_path, text)
    load = ["--enable-server-load-tracking"] if unit.spec.load_tracking else []
    base = [
        "vllm",
        "serve",
        "acme/tiny-model",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        *load,
        "--data-parallel-size",
        "3",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        "10.1.2.3",
        "--data-parallel-rpc-port",
        "29550",
    ]
    assert [m.argv() for m in unit.members()] == [
        base,
        [*base, "--headless", "--data-parallel-start-rank", "1"],
        [*base, "--headless", "--data-parallel-start-rank", "2"],
    ]
