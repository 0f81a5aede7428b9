"""The node's Hugging Face cache as huggingface_hub lays it out, read without the network.

`CACHE/models--ORG--NAME/` holds `blobs/<etag>` (each file's bytes, named by its LFS sha256 or
git blob id), `snapshots/<commit>/<path>` (symlinks into blobs: a link exists only once its blob
is complete) and `refs/<branch or tag>` (the commit it pointed at when last fetched).
huggingface_hub writes a download to `blobs/<etag>.<8 hex>.incomplete` and renames it when done.

Where the cache is: vLLM's `--download-dir` when the layout passes one, else `HF_HUB_CACHE`,
`HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub` - the layout's env
first, then the environment vsup runs in, as huggingface_hub itself looks.

After a pull vsup records the files it fetched in `$VSUP_HOME/cache/pulls/` (a manifest per
commit); `complete_snapshot` trusts a manifest first and otherwise asks for what vLLM cannot
start without: a config, the weights (every shard an index names) and a tokenizer file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup import paths
from vsup.fsutil import write_atomic
from vsup.pull.errors import PullError
from vsup.pull.selection import BIN_INDEX, MISTRAL_INDEX, SAFE_INDEX, RepoFile
from vsup.pullview import human_bytes

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"
# huggingface_hub >= 2's per-process temporary files (it never reuses them once its process ends)
_TEMP_RE = re.compile(r"^(?P<etag>.+)\.[0-9a-f]{8}\.incomplete$")
MANIFEST_SCHEMA = 1


def hub_cache_dir(env: Mapping[str, str], download_dir: str | None = None) -> Path:
    """The cache a vLLM with environment `env` (and `--download-dir`) uses for hub models."""
    if download_dir:
        return Path(download_dir).expanduser()
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = env.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "huggingface" / "hub"


def repo_dir(cache: Path, model: str) -> Path:
    """`CACHE/models--ORG--NAME` (huggingface_hub's `repo_folder_name`)."""
    return cache / ("models--" + model.replace("/", "--"))


def commit_of(cache: Path, model: str, revision: str | None) -> str | None:
    """The commit `revision` names in the cache: itself when it is a commit hash, else the ref
    huggingface_hub wrote when it last fetched it (None: never fetched)."""
    rev = revision or DEFAULT_REVISION
    if COMMIT_RE.match(rev):
        return rev
    try:
        text = (repo_dir(cache, model) / "refs" / rev).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if COMMIT_RE.match(text) else None


def snapshot_dir(cache: Path, model: str, commit: str) -> Path:
    return repo_dir(cache, model) / "snapshots" / commit


def write_ref(cache: Path, model: str, revision: str, commit: str) -> None:
    """`refs/REVISION` -> commit, as snapshot_download writes it (no-op for a commit hash)."""
    if COMMIT_RE.match(revision):
        return
    ref = repo_dir(cache, model) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(ref, commit)


def _present(snapshot: Path, name: str) -> bool:
    # a snapshot link that exists resolves to a complete blob (os.path.exists follows it)
    return os.path.exists(snapshot / name)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def manifest_path(model: str, commit: str, home: Path | None = None) -> Path:
    base = (home or paths.vsup_home()) / "cache" / "pulls"
    return base / ("models--" + model.replace("/", "--")) / f"{commit}.json"


def write_manifest(model: str, commit: str, files: Iterable[str], home: Path | None = None) -> None:
    """Remember which files a finished pull of `model` at `commit` fetched."""
    path = manifest_path(model, commit, home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc = {"schema": MANIFEST_SCHEMA, "model": model, "commit": commit, "files": sorted(files)}
    doc["at"] = time.time()
    write_atomic(path, json.dumps(doc), mode=0o600)


def _manifest_files(model: str, commit: str, home: Path | None) -> list[str] | None:
    try:
        doc = _json(manifest_path(model, commit, home))
    except OSError:
        return None
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        return None
    files = doc.get("files")
    if doc.get("model") != model or not isinstance(files, list):
        return None
    return [str(f) for f in files]


def missing_for_start(snapshot: Path) -> list[str]:
    """What vLLM needs from a snapshot and it lacks ([] = it can start from it offline)."""
    if not snapshot.is_dir():
        return ["the snapshot"]
    missing = []
    if not (_present(snapshot, "config.json") or _present(snapshot, "params.json")):
        missing.append("config.json")
    for index in (MISTRAL_INDEX, SAFE_INDEX, BIN_INDEX):
        if _present(snapshot, index):
            doc = _json(snapshot / index)
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            shards = sorted({str(v) for v in (weight_map or {}).values()})
            missing += [s for s in shards if not _present(snapshot, s)]
            break
    else:
        names = [p.name for p in snapshot.iterdir()]
        if not any(
            n.endswith((".safetensors", ".bin", ".pt")) and _present(snapshot, n) for n in names
        ):
            missing.append("weights")
    tokenizers = ("tokenizer.json", "tokenizer_config.json", "tekken.json", "vocab.json")
    has_tokenizer = any(_present(snapshot, t) for t in tokenizers) or any(
        p.name.startswith("tokenizer.model") and _present(snapshot, p.name)
        for p in snapshot.iterdir()
    )
    if not has_tokenizer:
        missing.append("a tokenizer")
    return missing


def complete_snapshot(
    cache: Path, model: str, revision: str | None, home: Path | None = None
) -> Path | None:
    """The local snapshot of `model` at `revision` when vLLM can start from it with the hub
    out of reach, else None. Reads the disk only."""
    commit = commit_of(cache, model, revision)
    if commit is None:
        return None
    snap = snapshot_dir(cache, model, commit)
    listed = _manifest_files(model, commit, home)
    if listed is not None:
        return snap if all(_present(snap, n) for n in listed) else None
    return snap if not missing_for_start(snap) else None


@dataclass(frozen=True)
class CacheState:
    """What a pull still has to fetch, given what the cache holds."""

    to_fetch: tuple[RepoFile, ...]
    present: tuple[RepoFile, ...]

    @property
    def bytes_to_fetch(self) -> int:
        return sum(f.size or 0 for f in self.to_fetch)

    @property
    def bytes_present(self) -> int:
        return sum(f.size or 0 for f in self.present)


def cache_state(cache: Path, model: str, commit: str, files: Iterable[RepoFile]) -> CacheState:
    """Split `files` into those the cache already holds (in this snapshot, or as a blob another
    revision shares) and those to fetch."""
    rdir = repo_dir(cache, model)
    snap = snapshot_dir(cache, model, commit)
    have: list[RepoFile] = []
    need: list[RepoFile] = []
    for f in files:
        held = _present(snap, f.name) or (
            f.blob is not None and (rdir / "blobs" / f.blob).is_file()
        )
        (have if held else need).append(f)
    return CacheState(tuple(need), tuple(have))


def existing_parent(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (where the cache would be created)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def reserve_bytes(total: int) -> int:
    """Free space a pull leaves on the disk: 1% of it, at most 1 GiB (the journal, logs and
    other users of the disk need some too)."""
    return min(2**30, total // 100)


def check_space(cache: Path, need: int) -> None:
    """Raise PullError(no_space) when the cache's disk cannot take `need` more bytes."""
    where = existing_parent(cache)
    usage = shutil.disk_usage(where)
    reserve = reserve_bytes(usage.total)
    if need + reserve <= usage.free:
        return
    short = need + reserve - usage.free
    raise PullError(
        "no_space",
        f"{human_bytes(short)} more free space is needed in {cache}: {human_bytes(need)} still to "
        f"fetch, {human_bytes(usage.free)} free on its disk ({where}), "
        f"{human_bytes(reserve)} kept free; free space there, or point HF_HUB_CACHE (or the "
        "layout's env HF_HOME) at a larger disk",
    )


def sweep_temp_files(cache: Path, model: str) -> list[Path]:
    """Remove temporary files that an ended download of `model` left in `blobs/` (a pull that
    was SIGKILLed, or a full disk): huggingface_hub >= 2 never reuses them. Only files of a
    blob whose download lock is free go: another process may be writing the rest."""
    blobs = repo_dir(cache, model) / "blobs"
    if not blobs.is_dir():
        return []
    try:
        from filelock import FileLock, Timeout
    except ImportError:
        return []
    locks = cache / ".locks" / repo_dir(cache, model).name
    removed = []
    try:
        locks.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []
    for tmp in blobs.iterdir():
        m = _TEMP_RE.match(tmp.name)
        if not m:
            continue
        try:
            with FileLock(str(locks / f"{m.group('etag')}.lock"), timeout=0):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
        except (Timeout, OSError):
            continue
    return removed
