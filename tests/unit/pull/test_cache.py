"""The Hugging Face cache read without the network: where it is, what a snapshot lacks, what a
pull still has to fetch, the disk check, and the sweep of temporary files ended downloads left."""

from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path

import pytest

from vsup.pull import cache
from vsup.pull.errors import PullError
from vsup.pull.selection import RepoFile

COMMIT = "a" * 40


def test_the_cache_is_found_where_huggingface_hub_looks():
    home = Path("~").expanduser()
    assert cache.hub_cache_dir({}) == home / ".cache/huggingface/hub"
    assert cache.hub_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert cache.hub_cache_dir({"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/h/hub")
    assert cache.hub_cache_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    # vLLM's --download-dir wins: that is where vLLM would look
    assert cache.hub_cache_dir({"HF_HUB_CACHE": "/c"}, "/d") == Path("/d")


def make_snapshot(root: Path, files: dict[str, bytes], model: str = "org/m") -> Path:
    repo = cache.repo_dir(root, model)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, (name, data) in enumerate(files.items()):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


def test_a_snapshot_is_complete_with_config_weights_and_a_tokenizer(tmp_path):
    files = {"config.json": b"{}", "model.safetensors": b"w", "tokenizer.json": b"{}"}
    snap = make_snapshot(tmp_path, files)
    assert cache.complete_snapshot(tmp_path, "org/m", None, home=tmp_path) == snap
    assert cache.complete_snapshot(tmp_path, "org/m", COMMIT, home=tmp_path) == snap
    assert cache.complete_snapshot(tmp_path, "org/m", "v2", home=tmp_path) is None  # never fetched
    # a link whose blob is gone is a file that is not there
    next((snap.parent.parent / "blobs").iterdir()).unlink()
    assert cache.missing_for_start(snap)


def test_a_shard_the_index_names_missing_makes_it_incomplete(tmp_path):
    index = b'{"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}'
    files = {
        "config.json": b"{}",
        "tokenizer_config.json": b"{}",
        "model.safetensors.index.json": index,
        "m-1.safetensors": b"w",
    }
    snap = make_snapshot(tmp_path, files)
    assert cache.missing_for_start(snap) == ["m-2.safetensors"]
    assert cache.complete_snapshot(tmp_path, "org/m", None, home=tmp_path) is None


def test_vsups_manifest_is_trusted_over_the_heuristic(tmp_path):
    files = {"config.json": b"{}", "model.safetensors": b"w", "tokenizer.json": b"{}"}
    make_snapshot(tmp_path, files)
    cache.write_manifest("org/m", COMMIT, [*files, "chat_template.jinja"], home=tmp_path)
    assert cache.complete_snapshot(tmp_path, "org/m", None, home=tmp_path) is None


def test_files_another_revision_shares_as_blobs_need_no_fetch(tmp_path):
    make_snapshot(tmp_path, {"config.json": b"{}"})
    blobs = cache.repo_dir(tmp_path, "org/m") / "blobs"
    (blobs / "sha-of-weights").write_bytes(b"weights")
    files = [
        RepoFile("config.json", 2, "x"),
        RepoFile("model.safetensors", 7, "sha-of-weights"),
        RepoFile("tokenizer.json", 5, "y"),
    ]
    state = cache.cache_state(tmp_path, "org/m", COMMIT, files)
    assert [f.name for f in state.to_fetch] == ["tokenizer.json"]
    assert state.bytes_to_fetch == 5 and state.bytes_present == 9


def test_the_disk_check_says_how_much_is_missing_and_where(tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda p: Usage(100 * 2**30, 0, 5 * 2**30))
    cache.check_space(tmp_path / "hub", 3 * 2**30)  # fits, with 1 GiB kept free
    with pytest.raises(PullError) as err:
        cache.check_space(tmp_path / "hub", 6 * 2**30)
    assert err.value.reason == "no_space"
    assert err.value.message.startswith(f"2.0 GiB more free space is needed in {tmp_path / 'hub'}")
    assert "6.0 GiB still to fetch, 5.0 GiB free on its disk" in err.value.message


def test_the_sweep_removes_only_temporary_files_nobody_is_writing(tmp_path):
    from filelock import FileLock

    make_snapshot(tmp_path, {"config.json": b"{}"})
    blobs = cache.repo_dir(tmp_path, "org/m") / "blobs"
    orphan = blobs / "etag1.0123abcd.incomplete"
    busy = blobs / "etag2.89abcdef.incomplete"
    old_style = blobs / "etag3.incomplete"  # huggingface_hub < 2 resumes from it: kept
    for p in (orphan, busy, old_style):
        p.write_bytes(b"partial")
    locks = tmp_path / ".locks" / "models--org--m"
    locks.mkdir(parents=True)
    with FileLock(str(locks / "etag2.lock")):
        removed = cache.sweep_temp_files(tmp_path, "org/m")
    assert removed == [orphan]
    assert busy.exists() and old_style.exists() and not orphan.exists()
