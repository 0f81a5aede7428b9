"""The workload: a [bench] table, flags over it, and the client flags of one share."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from vsup.bench.workload import Workload, WorkloadError, load_workload
from vsup.cli import build_parser
from vsup.commands.bench import take_back_layouts, workload_from_args


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "a.toml", *argv])


def test_a_bench_table_is_read_with_dashes_or_underscores(tmp_path: Path):
    f = tmp_path / "w.toml"
    f.write_text(
        "[bench]\nnum-prompts = 64\ninput_len = 256\noutput-len = 32\n"
        'request_rate = "inf"\nseed = 7\n'
    )
    wl = load_workload(f)
    assert wl == Workload(num_prompts=64, input_len=256, output_len=32, seed=7)
    assert math.isinf(wl.request_rate)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[bench]\nprompts = 3\n", ["[bench] key 'prompts'", "unknown key", "num_prompts"]),
        ("[bench]\nnum_prompts = '3'\n", ["key 'num_prompts'", "integer"]),
        ("[bench]\nrequest_rate = 0\n", ["request_rate must be > 0"]),
        ("[bench]\ndataset = 'sharegpt'\n", ["sharegpt dataset needs its file"]),
        ("[other]\nx = 1\n", ["no [bench] table"]),
        ("[bench\n", ["not valid TOML"]),
    ],
)
def test_a_bad_bench_table_says_file_key_and_fix(tmp_path: Path, text: str, words: list[str]):
    f = tmp_path / "w.toml"
    f.write_text(text)
    with pytest.raises(WorkloadError) as exc:
        load_workload(f)
    assert str(f) in str(exc.value)
    for w in words:
        assert w in str(exc.value)


def test_flags_override_the_file_and_dataset_replaces_its_path(tmp_path: Path):
    data = tmp_path / "sg.json"
    data.write_text("[]")
    f = tmp_path / "w.toml"
    f.write_text("[bench]\nnum_prompts = 100\ndataset = 'sharegpt'\ndataset_path = 'sg.json'\n")
    wl = workload_from_args(parse("--workload", str(f), "--num-prompts", "8"))
    assert (wl.num_prompts, wl.dataset, wl.dataset_path) == (8, "sharegpt", str(data))
    wl = workload_from_args(parse("--workload", str(f), "--dataset", "random"))
    assert (wl.dataset, wl.dataset_path) == ("random", None)
    args = parse("--dataset", "random", "b.toml")
    take_back_layouts(args)  # the layouts after --dataset are layouts
    assert args.layouts == ["b.toml", "a.toml"] and args.dataset == ["random"]
    args = build_parser().parse_args(["bench", "--dataset", "sharegpt", str(data), "a.toml"])
    take_back_layouts(args)
    assert args.layouts == ["a.toml"] and workload_from_args(args).dataset_path == str(data)
    with pytest.raises(WorkloadError, match="random dataset takes no file"):
        load_workload_text(tmp_path, "[bench]\ndataset_path = 'sg.json'\n")
    with pytest.raises(WorkloadError, match="does not exist"):
        workload_from_args(parse("--dataset", "sharegpt", str(tmp_path / "nope.json")))


def test_defaults_send_everything_at_once():
    wl = workload_from_args(parse())
    assert math.isinf(wl.request_rate) and wl.dataset == "random"


def test_client_flags_of_one_share():
    wl = Workload(num_prompts=16, input_len=32, output_len=16, request_rate=4.0)
    flags = wl.client_flags(8, 2.0, 3)
    assert flags == [
        "--dataset-name", "random", "--num-prompts", "8", "--random-input-len", "32",
        "--random-output-len", "16", "--request-rate", "2.0", "--seed", "3",
    ]  # fmt: skip
    assert wl.client_flags(8, math.inf, 0)[-3] == "inf"
    assert Workload().to_json()["request_rate"] == "inf"
    sharegpt = Workload(dataset="sharegpt", dataset_path="/d.json", output_len=64)
    assert sharegpt.client_flags(4, math.inf, 0)[:8] == [
        "--dataset-name", "sharegpt", "--num-prompts", "4", "--dataset-path", "/d.json",
        "--sharegpt-output-len", "64",
    ]  # fmt: skip


def load_workload_text(tmp_path: Path, text: str) -> Workload:
    f = tmp_path / "x.toml"
    f.write_text(text)
    return load_workload(f)
