import os
import signal
import subprocess
import sys
import time

import psutil

from vsup.engine.runlog import RunLogs


def test_run_files_are_named_private_and_only_the_last_runs_are_kept(tmp_path):
    logs = RunLogs(tmp_path, "gpu0", keep=3)
    for run in range(1, 6):
        with logs.open_for_run(run, f"[vsup] run {run}") as f:
            f.write(b"hello\n")
    assert logs.runs() == [3, 4, 5]
    assert logs.path(5).name == "run-0005.log"
    assert logs.path(5).read_text() == "[vsup] run 5\nhello\n"
    assert logs.path(5).stat().st_mode & 0o777 == 0o600
    assert logs.dir.stat().st_mode & 0o777 == 0o700


def test_cap_moves_the_older_part_aside_and_appends_continue(tmp_path):
    logs = RunLogs(tmp_path, "a", max_bytes=1000)
    writer = logs.open_for_run(1, "[vsup] run 1")  # as the child holds it: O_APPEND
    writer.write(b"x" * 1500 + b"\n")
    assert logs.cap(1)
    writer.write(b"after the cut\n")
    writer.close()
    live = logs.path(1).read_text()
    assert live.startswith("[vsup] log passed 1000 bytes") and live.endswith("after the cut\n")
    older = (logs.dir / "run-0001.log.1").read_text()
    assert older.startswith("[vsup] run 1\n") and len(older) > 1500
    assert not logs.cap(1)


def test_tail_drops_the_partial_first_line_and_reads_the_older_part_when_short(tmp_path):
    logs = RunLogs(tmp_path, "a", max_bytes=100)
    with logs.open_for_run(1, "[vsup] run 1") as f:
        f.write("".join(f"line {i}\n" for i in range(30)).encode())
    tail = logs.tail(1, nbytes=40)
    assert tail.endswith("line 29\n") and tail.splitlines()[0].startswith("line ")
    logs.cap(1)
    # the live part is short now: the tail reaches back into the copied part
    assert "line 29" in logs.tail(1, nbytes=4096)
    assert logs.tail(7) == ""


def test_old_copies_go_with_their_run(tmp_path):
    logs = RunLogs(tmp_path, "a", keep=1, max_bytes=10)
    with logs.open_for_run(1, "[vsup] run 1") as f:
        f.write(b"x" * 100)
    logs.cap(1)
    logs.open_for_run(2, "[vsup] run 2").close()
    assert sorted(p.name for p in logs.dir.iterdir()) == ["run-0002.log"]


MIB = 1024 * 1024


def spam(writer, start: int, count: int) -> None:
    writer.write(b"".join(f"line {i:08d} {'x' * 50}\n".encode() for i in range(start, count)))


def on_disk(path) -> int:
    return path.stat().st_blocks * 512


def test_past_the_cap_the_middle_is_released_and_offsets_stay(tmp_path):
    logs = RunLogs(tmp_path, "a", max_bytes=2 * MIB)
    writer = logs.open_for_run(1, "[vsup] run 1")
    spam(writer, 0, 150_000)  # ~9 MiB
    path = logs.path(1)
    size = path.stat().st_size
    assert logs.cap(1)
    assert path.stat().st_size == size  # nothing moved: offsets still mean what they meant
    assert on_disk(path) <= 2 * MIB + 8192
    assert not (logs.dir / "run-0001.log.1").exists()
    with open(path, "rb") as f:
        assert f.read(12) == b"[vsup] run 1"  # the start of the run is kept
    assert logs.tail(1).endswith("line 00149999 " + "x" * 50 + "\n")
    spam(writer, 150_000, 151_000)  # the child's O_APPEND writes go on at the end
    writer.close()
    assert path.stat().st_size > size and logs.tail(1).splitlines()[-1].startswith("line 00150999")
    assert not logs.cap(1)  # under the cap plus its step: no release for a few bytes


def test_a_reader_by_offset_skips_the_released_part_with_a_note(tmp_path):
    from vsup.control.api import read_log_chunk

    logs = RunLogs(tmp_path, "a", max_bytes=2 * MIB)
    with logs.open_for_run(1, "[vsup] run 1") as writer:
        spam(writer, 0, 150_000)
    path = logs.path(1)
    assert logs.cap(1)
    chunks = [read_log_chunk(path, 0, None)]
    while not chunks[-1]["eof"]:
        chunks.append(read_log_chunk(path, chunks[-1]["offset"], None))
    text = "".join(c["text"] for c in chunks)
    assert "\0" not in text
    lines = text.splitlines()
    assert lines[0] == "[vsup] run 1"
    (note,) = [i for i, line in enumerate(lines) if "bytes of this log were released" in line]
    numbers = [int(line.split()[1]) for line in lines[1:] if line.startswith("line ")]
    before, after = numbers[: note - 1], numbers[note - 1 :]
    assert before == list(range(len(before)))  # the head, whole lines
    assert after == list(range(after[0], 150_000))  # then every line to the end
    assert all(len(line) == 64 for line in lines[1:] if line.startswith("line "))
    # a reader that was inside the released part goes on after it, with the note
    inside = read_log_chunk(path, 3 * MIB, None)
    assert inside["text"].startswith("[vsup] ... ") and inside["start"] > 3 * MIB
    tail = read_log_chunk(path, None, 4096)
    assert tail["text"].splitlines()[-1].startswith("line 00149999")


def test_the_log_watcher_reads_on_after_the_released_part(tmp_path):
    from vsup.telemetry.logwatch import LogWatcher

    logs = RunLogs(tmp_path, "a", max_bytes=2 * MIB)
    writer = logs.open_for_run(1, "[vsup] run 1")
    spam(writer, 0, 10)
    watcher = LogWatcher(logs.path(1))
    assert len(watcher.poll().new_lines) == 11
    spam(writer, 10, 150_000)
    assert logs.cap(1)
    seen: list[str] = []
    while True:
        update = watcher.poll()
        if not update.bytes_read:
            break
        seen += update.new_lines
    assert seen and all(line.startswith("line ") and len(line) == 64 for line in seen)
    numbers = [int(line.split()[1]) for line in seen]
    # the rest of the kept start, then (past the hole) every line to the end, all whole
    jump = next(i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1)
    assert numbers[:jump] == list(range(10, 10 + jump))
    assert numbers[jump:] == list(range(numbers[jump], 150_000)) and numbers[jump] > 100_000
    writer.close()


def guards_of(path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) > 3 and cmd[-4].endswith("logcap.py") and cmd[-3] == str(path):
            out.append(p)
    return out


def test_a_log_guard_keeps_its_run_under_the_cap_without_a_daemon_and_ends_with_the_run(
    tmp_path,
):
    # the "instance": a process group of its own that writes its log as fast as it can
    logs = RunLogs(tmp_path, "a", max_bytes=2 * MIB)
    with logs.open_for_run(1, "[vsup] run 1") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", SPAMMER], stdout=out, stderr=out, start_new_session=True
        )
    try:
        logs.start_guard(1, child.pid)  # returns once the guard holds the run
        assert logs.guarded(1)
        (guard,) = guards_of(logs.path(1))
        # nobody's child here (it forked away from the process this test started), in a
        # session and group of its own: not part of the instance's tree or group
        assert guard.ppid() != os.getpid() and os.getpgid(guard.pid) != child.pid
        assert psutil.Process(guard.pid).pid not in [c.pid for c in psutil.Process().children()]
        logs.start_guard(1, child.pid)  # a second guard finds the run held and goes
        # (it may still be on its way out the moment start_guard returns: seen in the suite)
        gone_by = time.monotonic() + 30
        while len(guards_of(logs.path(1))) > 1 and time.monotonic() < gone_by:
            time.sleep(0.05)
        assert [g.pid for g in guards_of(logs.path(1))] == [guard.pid]
        peak = 0
        deadline = time.monotonic() + 60
        while logs.path(1).stat().st_size < 40 * MIB:
            assert time.monotonic() < deadline, "the writer stopped"
            peak = max(peak, on_disk(logs.path(1)))
            time.sleep(0.02)
        assert peak <= 2 * MIB + logs.step_bytes + 16 * MIB, peak / MIB
        with open(logs.path(1), "rb") as f:
            assert f.read(12) == b"[vsup] run 1"  # the start of the run is kept
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    # the run is over: a last check, then the guard goes
    deadline = time.monotonic() + 30
    while guards_of(logs.path(1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not guards_of(logs.path(1))
    assert not logs.guarded(1) and on_disk(logs.path(1)) <= 2 * MIB + logs.step_bytes


# writes 65-byte lines, 64 KiB at a time, about 16 MB/s, until killed
SPAMMER = """
import os, time
n = 0
while True:
    os.write(1, b"".join(b"line %08d %s\\n" % (i, b"x" * 50) for i in range(n, n + 1024)))
    n += 1024
    time.sleep(0.004)
"""
