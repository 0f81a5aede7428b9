"""vLLM's IPC sockets in a directory of the instance's, emptied before each start (rpcdir.py).

A killed vLLM never removes its `ipc://$VLLM_RPC_BASE_PATH/<uuid>` sockets; with vLLM's default
(the temp directory) every crash or SIGKILL left them in /tmp for good."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from vsup.engine import rpcdir
from vsup.engine.runlog import RunLogs
from vsup.engine.spawn import Launched, launch

from tests.factories import instance_spec
from tests.ports import free_port


def _socket_file(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, as a killed server's does


def _short_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="rpc-", dir="/tmp"))


def test_the_directory_is_in_the_instance_s_log_directory_when_a_socket_path_fits():
    assert rpcdir.rpc_dir(Path("/tmp/h/logs/a")) == Path("/tmp/h/logs/a/.rpc")


def test_a_log_directory_too_long_for_a_socket_path_gets_a_private_one_in_the_temp_dir():
    deep = Path("/tmp") / ("d" * 80) / "logs" / "an-instance"
    where = rpcdir.rpc_dir(deep)
    assert where.parent == Path(tempfile.gettempdir())
    assert where.name.startswith(f"vsup-rpc-{os.getuid()}-")
    assert len(os.fsencode(where / ("u" * 36))) <= 107
    # one per instance (and per home): another log directory, another socket directory
    assert rpcdir.rpc_dir(deep.with_name("other")) != where


def test_prepare_removes_sockets_only_and_makes_it_private(tmp_path):
    base = _short_dir()
    try:
        where = base / "x"
        where.mkdir()
        _socket_file(where / "0c1d")
        (where / "keep.txt").write_text("not a socket")
        rpcdir.prepare(where)
        assert sorted(os.listdir(where)) == ["keep.txt"]
        fresh = base / "y"
        rpcdir.prepare(fresh)
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
        assert rpcdir.clear(base / "missing") == 0
    finally:
        shutil.rmtree(base)


def test_release_removes_the_sockets_then_the_directory_when_nothing_else_is_in_it():
    base = _short_dir()
    try:
        alone = base / "alone"
        alone.mkdir()
        _socket_file(alone / "0c1d")
        assert rpcdir.release(alone) == 1
        assert not alone.exists()  # no empty directory left behind per instance
        kept = base / "kept"
        kept.mkdir()
        _socket_file(kept / "0c1d")
        (kept / "keep.txt").write_text("not a socket")
        assert rpcdir.release(kept) == 1
        assert sorted(os.listdir(kept)) == ["keep.txt"]  # nothing but sockets is removed
        assert rpcdir.release(base / "missing") == 0
    finally:
        shutil.rmtree(base)


def _run(spec, logs: RunLogs, out: Path) -> None:
    result = launch(spec, logs, 1, "2026-12-06T00:00:00Z", base_env={"PATH": os.defpath})
    assert isinstance(result, Launched), result
    assert result.popen.wait(timeout=30) == 0, out.read_text() if out.exists() else ""


def test_a_start_gets_its_own_socket_directory_emptied_of_a_killed_run_s_sockets():
    home = _short_dir()
    out = home / "seen"
    script = f'printf "%s\\n" "$VLLM_RPC_BASE_PATH" > {out}; ls -A "$VLLM_RPC_BASE_PATH" >> {out}'
    spec = instance_spec("a", command=("sh", "-c", script), port=free_port())
    logs = RunLogs(home / "logs", "a")
    where = rpcdir.rpc_dir(logs.dir)
    try:
        where.mkdir(parents=True)
        _socket_file(where / "5f0e1d2c-left-by-a-killed-run")
        _run(spec, logs, out)
        lines = out.read_text().splitlines()
        assert lines == [str(where)]  # the variable names it, and nothing of the last run is left

        # a directory the layout names is the layout's: vsup neither changes nor empties it
        own = home / "mine"
        own.mkdir()
        _socket_file(own / "theirs")
        mine = instance_spec(
            "a", command=spec.command, port=spec.port, env={"VLLM_RPC_BASE_PATH": str(own)}
        )
        _run(mine, logs, out)
        assert out.read_text().splitlines() == [str(own), "theirs"]
    finally:
        shutil.rmtree(home)
