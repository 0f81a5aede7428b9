import os
import socket
import sys

from vsup.engine.proc import ProcInfo, describe, live_tree, read_stat
from vsup.engine.spawn import child_env, port_holder

from tests.factories import instance_spec


def spec(**kw):
    """An instance on GPUs 2 and 3 whose env a child's must override (HIP_VISIBLE_DEVICES)."""
    base = dict(
        command=("python", "-m", "x"),
        port=1,
        gpus=(2, 3),
        gpu_memory_utilization=0.4,
        env={"HIP_VISIBLE_DEVICES": "0", "X": "1"},
        api_key_env="MY_KEY",
    )
    return instance_spec(**{**base, **kw})


def test_child_env_puts_the_daemons_interpreter_first_and_the_key_by_name():
    env = child_env(spec(), {"PATH": "/usr/bin", "MY_KEY": "k", "HIP_VISIBLE_DEVICES": "1"})
    assert env["PATH"] == os.path.dirname(sys.executable) + ":/usr/bin"
    assert env["VLLM_API_KEY"] == "k" and env["X"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "HIP_VISIBLE_DEVICES" not in env
    assert "k" not in spec().argv()


def test_port_holder_finds_a_listener_and_names_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        held = port_holder("127.0.0.1", port)
        assert held is not None and f"pid {os.getpid()}" in held
        # a wildcard bind clashes with a loopback listener too
        assert port_holder("0.0.0.0", port) is not None
    assert port_holder("127.0.0.1", port) is None


def test_read_stat_matches_psutil():
    import psutil

    me = read_stat(os.getpid())
    assert me.pgid == os.getpgid(0) and me.ppid == os.getppid()
    # psutil reads the kernel's boot time at another moment, which may have moved by 1 s since
    # (proc.py, SAME_PROCESS_S): the same process, read equal or 1 s apart
    off = abs(me.create_time - psutil.Process().create_time())
    assert min(off, abs(off - 1.0)) < 0.02, off
    assert read_stat(2**22 + 12345) is None


def test_a_process_stays_itself_when_the_boot_time_moves_by_a_second(monkeypatch):
    """The kernel's boot time moved by exactly 1 s during a run (2026-12-07): a daemon restarted
    after it read its instance's start time 1.0 s off and refused to re-adopt it."""
    from vsup.control.liveness import process_matches
    from vsup.engine import proc

    recorded = read_stat(os.getpid()).create_time
    monkeypatch.setattr(proc, "_BOOT", proc._BOOT + 1.0)
    moved = read_stat(os.getpid()).create_time
    assert abs(moved - recorded - 1.0) < 1e-6
    assert process_matches(os.getpid(), recorded)
    # a pid reused by a process started seconds later is still another process
    assert not process_matches(os.getpid(), recorded - 3.0)


def test_describe_names_a_process_and_its_kernel_state():
    import signal
    import subprocess
    import time

    # a name with a space and a parenthesis, as /proc/PID/stat's comm field may hold
    program = (
        "import ctypes, time; ctypes.CDLL(None).prctl(15, b'VLLM::W (x)', 0, 0, 0); "
        "print('go', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"go\n"
        # on a loaded machine it may still be running on its way into sleep()
        deadline = time.monotonic() + 5
        while "(S:" not in describe(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert describe(child.pid) == f"{child.pid} VLLM::W (x) (S: sleeping)"
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while "(T:" not in describe(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert describe(child.pid) == f"{child.pid} VLLM::W (x) (T: stopped)"
        child.kill()
        deadline = time.monotonic() + 5
        while "(Z:" not in describe(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # a dead, unreaped child: its memory map is gone, so it reads as exiting
        assert (
            describe(child.pid) == f"{child.pid} VLLM::W (x) (Z: a zombie nobody reaped, exiting)"
        )
    finally:
        child.kill()
        child.wait()
    assert describe(child.pid) == f"{child.pid} (gone)"


def table(*rows):
    return {r[0]: ProcInfo(*r) for r in rows}


def test_tree_is_group_plus_known_plus_their_descendants():
    t = table(
        (100, 1, 100, "S", 50.0),  # API server, group leader
        (101, 100, 100, "S", 51.0),  # EngineCore
        (102, 101, 100, "S", 52.0),  # worker
        (103, 1, 103, "S", 53.0),  # descendant that called setsid, re-parented
        (104, 103, 103, "S", 54.0),  # its child
        (105, 1, 105, "S", 55.0),  # a stranger
        (106, 100, 100, "Z", 56.0),  # a zombie holds nothing
    )
    tree = live_tree(100, {103: 53.0}, 50.0, t)
    assert sorted(tree) == [100, 101, 102, 103, 104]


def test_orphans_keep_the_group_after_the_leader_is_gone():
    t = table((101, 1, 100, "S", 51.0), (102, 101, 100, "S", 52.0))
    assert sorted(live_tree(100, {}, 50.0, t)) == [101, 102]


def test_a_group_id_whose_leader_pid_was_reused_is_not_ours():
    # pid 100 is now another process (started later): the old group cannot exist any more
    t = table((100, 1, 100, "S", 900.0), (101, 100, 100, "S", 901.0))
    assert live_tree(100, {}, 50.0, t) == {}


def test_a_known_pid_reused_by_another_process_is_not_ours():
    t = table((103, 1, 103, "S", 500.0))
    assert live_tree(None, {103: 53.0}, 50.0, t) == {}


async def test_exit_is_seen_without_pidfd_too(monkeypatch):
    """Kernels before 5.3 have no pidfd_open: the watcher polls instead."""
    import errno
    import signal
    import subprocess

    from vsup.engine import proc as procmod

    def no_pidfd(pid):
        raise OSError(errno.ENOSYS, "pidfd_open")

    monkeypatch.setattr(procmod.os, "pidfd_open", no_pidfd)
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    info = read_stat(child.pid)
    watched = procmod.RunningProcess(child.pid, child.pid, info.create_time, 1, child)
    exited = watched.watch()
    assert watched._poller is not None
    os.kill(child.pid, signal.SIGKILL)
    status = await exited
    assert (status.code, status.signum) == (None, signal.SIGKILL)
    assert child.returncode == -signal.SIGKILL  # reaped: no zombie left


async def test_adopting_a_pid_that_now_names_another_process_is_refused():
    import subprocess

    import pytest

    from vsup.engine.proc import RunningProcess

    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        impostor = RunningProcess(child.pid, child.pid, create_time=1.0, run=1)
        with pytest.raises(ProcessLookupError):
            impostor.watch()
    finally:
        child.kill()
        child.wait()
