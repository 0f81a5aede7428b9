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
