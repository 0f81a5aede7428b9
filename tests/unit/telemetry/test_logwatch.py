"""The incremental log watcher on real vLLM logs written piece by piece."""

from __future__ import annotations

from pathlib import Path

from vsup.telemetry.logwatch import MAX_LINE_CHARS, LogWatcher, scan_log

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"


def test_a_growing_real_log_is_followed_to_readiness(tmp_path: Path) -> None:
    data = (FIX / "load.log").read_bytes()
    log = tmp_path / "run1.log"
    watcher = LogWatcher(log, max_read=4096)
    assert watcher.poll().bytes_read == 0  # not created yet: nothing, no error
    ready_at = None
    with open(log, "wb") as f:
        for i in range(0, len(data), 777):  # the server writes in odd-sized pieces
            f.write(data[i : i + 777])
            f.flush()
            while watcher.poll().bytes_read:
                pass
            if ready_at is None and watcher.ready_logged:
                ready_at = i
    assert ready_at is not None and ready_at < len(data)
    assert watcher.listen_url.startswith("http://127.0.0.1:")
    assert watcher.platform == "cpu"
    info = watcher.backend_info()
    assert (info.name, info.source) == ("CPU_ATTN", "default")
    assert watcher.offset == len(data)
    lines = data.decode().splitlines()
    assert watcher.tail_text(3).splitlines() == [ln[:MAX_LINE_CHARS] for ln in lines[-3:]]


def test_a_line_is_taken_only_once_its_newline_arrived(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    watcher = LogWatcher(log)
    log.write_bytes(b"INFO Starting vLLM API ser")
    assert watcher.poll().new_lines == ()
    with open(log, "ab") as f:
        f.write(b"ver on http://0.0.0.0:8000\nINFO:     Application startup complete.\n")
    update = watcher.poll()
    assert update.new_lines == (
        "INFO Starting vLLM API server on http://0.0.0.0:8000",
        "INFO:     Application startup complete.",
    )
    assert watcher.listen_url == "http://0.0.0.0:8000" and watcher.ready_logged


def test_a_truncated_or_replaced_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    watcher = LogWatcher(log)
    watcher.poll()
    log.write_bytes(b"new\n")
    update = watcher.poll()
    assert update.restarted and update.new_lines == ("new",)
    assert list(watcher.tail) == ["one", "two", "three", "new"]


def test_tail_is_bounded_and_long_lines_are_cut(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(500)) + b"x" * 10000 + b"\n")
    watcher = scan_log(log, tail_lines=50)
    assert len(watcher.tail) == 50
    assert watcher.tail[-2] == "line 499"
    assert len(watcher.tail[-1]) == MAX_LINE_CHARS + 3


def test_reads_are_bounded_per_poll(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"a" * 99 + b"\n" + b"b" * 99 + b"\n")
    watcher = LogWatcher(log, max_read=64)
    sizes = []
    while n := watcher.poll().bytes_read:
        sizes.append(n)
    assert max(sizes) <= 64 and sum(sizes) == 200
    assert list(watcher.tail) == ["a" * 99, "b" * 99]


def test_progress_bars_and_colours_read_as_a_terminal_shows_them(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(
        b"Loading: 0%\rLoading: 50%\rLoading: 100%\n"
        b"\x1b[32mINFO\x1b[0m [rocm.py:246] Using Triton Attention backend on V1 engine.\x1b[0m\n"
        b"bad bytes \xff\xfe here\n"
    )
    watcher = scan_log(log)
    assert watcher.tail[0] == "Loading: 100%"
    assert watcher.tail[1] == "INFO [rocm.py:246] Using Triton Attention backend on V1 engine."
    assert "bad bytes" in watcher.tail[2]
    info = watcher.backend_info(flag="ROCM_ATTN")
    assert (info.name, info.label, info.source) == ("TRITON_ATTN", "Triton unified", "log")
    assert watcher.platform == "rocm"


def test_resuming_from_an_offset_skips_what_was_read(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"old\nnew\n")
    watcher = LogWatcher(log, offset=4)
    assert watcher.poll().new_lines == ("new",)
