"""The bench/tune client pool: vsup's real bootstrap (client.BOOTSTRAP) and ClientPool, run by
a real Python against a stand-in `vllm` package (a `serve` module with vLLM's entry points:
`add_cli_args`, `main`, and `main_async` or not). The real vLLM client runs in
tests/integration/test_bench.py and test_tune_vllm.py."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from vsup.bench.client import ClientPool, ClientRun, client_argv

SERVE = """
import asyncio, json, os, sys

def add_cli_args(p):
    p.add_argument("--result", required=True)
    p.add_argument("--num-prompts", type=int, default=3)
    p.add_argument("--fail", action="store_true")

async def main_async(args):
    for i in range(1, args.num_prompts + 1):
        sys.stderr.write(f"\\r 50%|#   | {i}/{args.num_prompts} [00:01<00:01]")
    sys.stderr.flush()
    if args.fail:
        raise RuntimeError("ConnectionError: the server went away")
    doc = {"completed": args.num_prompts, "pid": os.getpid()}
    json.dump(doc, open(args.result, "w"))
    return doc

def main(args):
    return asyncio.run(main_async(args))
"""


def stand_in_vllm(root: Path, loop: bool) -> dict[str, str]:
    """A `vllm` package with the modules the bootstrap imports; the env that finds it."""
    pkg = root / "vllm"
    (pkg / "utils").mkdir(parents=True)
    (pkg / "benchmarks").mkdir()
    (pkg / "__init__.py").write_text('__version__ = "9.9.9"\n')
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "argparse_utils.py").write_text(
        "from argparse import ArgumentParser as FlexibleArgumentParser\n"
    )
    (pkg / "benchmarks" / "__init__.py").write_text("")
    serve = SERVE if loop else SERVE.replace("main_async", "run_once")
    (pkg / "benchmarks" / "serve.py").write_text(textwrap.dedent(serve))
    return {**os.environ, "PYTHONPATH": str(root)}


def run_of(tmp_path: Path, env: dict[str, str], k: int, *extra: str) -> ClientRun:
    folder = tmp_path / f"run{k}"
    flags = ["--result", str(folder / "r.json"), "--num-prompts", str(k + 2), *extra]
    return ClientRun(
        instance="cpu0",
        argv=client_argv(sys.executable, flags),
        env=env,
        log_path=folder / "c.log",
        result_path=folder / "r.json",
        total=k + 2,
        flags=flags,
    )


def result(c: ClientRun) -> dict:
    doc = c.result()
    assert doc is not None, c.tail
    return doc


def one_run(pool: ClientPool, c: ClientRun) -> int:
    pool.start(c)
    assert c.wait_ready(60), c.tail
    c.go()
    return c.wait(60)


def test_a_looping_client_runs_every_round_in_one_process(tmp_path: Path):
    env = stand_in_vllm(tmp_path / "py", loop=True)
    pool = ClientPool()
    runs = [run_of(tmp_path, env, k) for k in range(3)]
    try:
        for k, c in enumerate(runs):
            assert one_run(pool, c) == 0
            assert c.loop and c.vllm_version == "9.9.9"
            assert result(c)["completed"] == k + 2
            assert c.done_requests == k + 2 and c.measuring  # this run's own progress
            assert f"{k + 2}/{k + 2} [" in c.log_path.read_text()
        assert [c.reused for c in runs] == [False, True, True]
        assert len({result(c)["pid"] for c in runs}) == 1  # vLLM imported once
        assert (pool.started, pool.reused) == (1, 2)
        assert f"{2}/{2} [" not in runs[1].log_path.read_text()  # each run its own log
        proc = runs[0].proc
        assert proc is not None and proc.poll() is None  # idle, waiting for the next run
    finally:
        pool.close()
    assert proc.poll() == 0  # told there is no next run, it exited by itself


def test_a_failed_run_leaves_the_process_ready_for_the_next(tmp_path: Path):
    env = stand_in_vllm(tmp_path / "py", loop=True)
    pool = ClientPool()
    try:
        first = run_of(tmp_path, env, 0)
        assert one_run(pool, first) == 0
        bad = run_of(tmp_path, env, 1, "--fail")
        assert one_run(pool, bad) == 1 and bad.reused
        assert bad.failure() == "RuntimeError: ConnectionError: the server went away"
        bad_flag = run_of(tmp_path, env, 2, "--no-such-flag")
        assert one_run(pool, bad_flag) == 2  # argparse refuses the flags of this run only
        assert "unrecognized arguments: --no-such-flag" in bad_flag.failure()
        again = run_of(tmp_path, env, 3)
        assert one_run(pool, again) == 0 and again.reused
        assert result(again)["pid"] == result(first)["pid"]
    finally:
        pool.close()


def test_a_different_environment_gets_a_process_of_its_own(tmp_path: Path):
    env = stand_in_vllm(tmp_path / "py", loop=True)
    pool = ClientPool()
    try:
        a = run_of(tmp_path, env, 0)
        assert one_run(pool, a) == 0
        b = run_of(tmp_path, {**env, "HF_HOME": str(tmp_path / "other")}, 1)
        assert one_run(pool, b) == 0 and not b.reused
        assert result(a)["pid"] != result(b)["pid"]
    finally:
        pool.close()
    assert a.proc.poll() is not None and b.proc.poll() is not None


def test_without_main_async_each_run_starts_a_process_as_before(tmp_path: Path):
    env = stand_in_vllm(tmp_path / "py", loop=False)
    pool = ClientPool()
    runs = [run_of(tmp_path, env, k) for k in range(2)]
    try:
        for c in runs:
            assert one_run(pool, c) == 0 and not c.loop and not c.reused
            assert c.proc.poll() == 0  # ran once and exited
    finally:
        pool.close()
    assert result(runs[0])["pid"] != result(runs[1])["pid"]
    assert (pool.started, pool.reused) == (2, 0)


@pytest.mark.parametrize("loop", [True, False])
def test_a_client_stopped_before_go_exits_3(tmp_path: Path, loop: bool):
    env = stand_in_vllm(tmp_path / "py", loop=loop)
    c = run_of(tmp_path, env, 0)
    c.start()
    assert c.wait_ready(60)
    assert c.proc is not None and c.proc.stdin is not None
    c.proc.stdin.close()
    assert c.wait(30) == 3 and c.result() is None
    assert json.dumps(c.command_line)
