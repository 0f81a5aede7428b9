"""One pull: the hub's file list, the files vLLM loads, the disk check, then huggingface_hub's
downloads, a few files at a time, with progress reports and cancellation.

Order of work (nothing is written before step 4):
1. `list_repo`: the commit the revision points at, every file and its size;
2. the safetensors index (a small JSON file) when the repository has one: it names the shards;
3. `select_files` (selection.py), then what the cache holds already (`cache_state`);
4. the disk check: free space on the cache's disk >= the bytes still to fetch (+ a reserve);
5. `hf_hub_download(revision=COMMIT)` per file (`workers` at a time): every file of the one
   commit, even if the branch moves meanwhile; huggingface_hub locks each blob, so another
   pull (or a vLLM) fetching the same file waits and then finds it there;
6. `refs/REVISION`, then a check that vLLM can start from the snapshot, then vsup's manifest.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup.pull import cache as cache_mod
from vsup.pull.errors import PullCancelled, PullError
from vsup.pull.progress import ProgressReport, PullProgress
from vsup.pull.remote import RepoListing, classify, endpoint, list_repo
from vsup.pull.selection import Selection, select_files

DEFAULT_WORKERS = 8


@dataclass(frozen=True)
class PullRequest:
    """What to pull and where."""

    model: str
    revision: str | None  # None: the hub's default branch
    cache_dir: Path
    load_format: str | None = None  # vLLM's --load-format (None: auto)
    token_env: str | None = None  # the variable the token came from, for messages

    @property
    def rev(self) -> str:
        return self.revision or cache_mod.DEFAULT_REVISION

    @property
    def label(self) -> str:
        return self.model if self.revision is None else f"{self.model}@{self.revision}"


@dataclass(frozen=True)
class PullPlan:
    """What a pull will fetch (steps 1-3), before any weight is downloaded."""

    request: PullRequest
    listing: RepoListing
    selection: Selection
    state: cache_mod.CacheState

    @property
    def snapshot(self) -> Path:
        return cache_mod.snapshot_dir(
            self.request.cache_dir, self.request.model, self.listing.commit
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.request.model,
            "revision": self.request.rev,
            "commit": self.listing.commit,
            "cache_dir": str(self.request.cache_dir),
            "files": [f.name for f in self.selection.files],
            "left_out": list(self.selection.left_out),
            "weights": self.selection.weights,
            "note": self.selection.note,
            "bytes_total": self.selection.total_bytes,
            "bytes_to_fetch": self.state.bytes_to_fetch,
        }


@dataclass(frozen=True)
class PullResult:
    plan: PullPlan
    fetched_bytes: int
    elapsed_s: float

    @property
    def snapshot(self) -> Path:
        return self.plan.snapshot

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.to_json(),
            "snapshot": str(self.snapshot),
            "fetched_bytes": self.fetched_bytes,
            "elapsed_s": round(self.elapsed_s, 2),
        }


def _download(req: PullRequest, name: str, commit: str, token: str | None, **kw: Any) -> str:
    from huggingface_hub import hf_hub_download

    return str(
        hf_hub_download(
            req.model,
            name,
            revision=commit,
            cache_dir=str(req.cache_dir),
            token=token,
            endpoint=endpoint(),
            **kw,
        )
    )


def _error(exc: BaseException, req: PullRequest, token: str | None) -> PullError:
    if isinstance(exc, PullError):
        return exc
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return PullError(
            "no_space",
            f"the disk of {req.cache_dir} filled up during the pull ({exc.strerror}): free space "
            "there, then pull again (files already fetched are kept)",
        )
    return classify(exc, req.model, req.rev, endpoint(), token is not None)


def check_online(env: dict[str, str] | None = None) -> None:
    """Raise PullError(offline) when HF_HUB_OFFLINE forbids asking the hub."""
    value = (env if env is not None else os.environ).get("HF_HUB_OFFLINE", "")
    if value.strip().lower() in ("1", "true", "yes", "on"):
        raise PullError(
            "offline", "HF_HUB_OFFLINE is set, so vsup does not ask the hub: unset it to pull"
        )


def plan_pull(req: PullRequest, token: str | None) -> PullPlan:
    """Steps 1-3: ask the hub what to fetch (the safetensors index, if any, is fetched)."""
    check_online()
    listing = list_repo(req.model, req.rev, token)

    def read_json(name: str) -> Any:
        try:
            path = _download(req, name, listing.commit, token)
            return json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        except Exception as exc:
            raise _error(exc, req, token) from None

    selection = select_files(listing.files, read_json, req.load_format)
    state = cache_mod.cache_state(req.cache_dir, req.model, listing.commit, selection.files)
    return PullPlan(req, listing, selection, state)


def pull_model(
    req: PullRequest,
    token: str | None,
    *,
    on_plan: Callable[[PullPlan], None] | None = None,
    on_progress: Callable[[ProgressReport], None] | None = None,
    cancel: threading.Event | None = None,
    workers: int = DEFAULT_WORKERS,
    report_every_s: float = 0.5,
    check_space: bool = True,
) -> PullResult:
    """Pull `req` (steps 1-6); raises PullError (PullCancelled once `cancel` is set, or on
    Ctrl-C: the files finished so far stay in the cache, the one in flight is dropped)."""
    started = time.monotonic()
    cancel = cancel or threading.Event()
    plan = plan_pull(req, token)
    if on_plan is not None:
        on_plan(plan)
    cache_mod.sweep_temp_files(req.cache_dir, req.model)
    if check_space:
        cache_mod.check_space(req.cache_dir, plan.state.bytes_to_fetch)
    present = {f.name for f in plan.state.present}
    progress = PullProgress(plan.selection.files, cached=present, cancel=cancel)
    failure = _fetch_all(
        req, token, plan, progress, present, cancel, workers, report_every_s, on_progress
    )
    if failure is not None:
        raise _error(failure, req, token) from None
    if on_progress is not None:
        on_progress(progress.report())
    _complete(req, plan)
    return PullResult(plan, progress.report().fetched_bytes, time.monotonic() - started)


def _fetch_all(
    req: PullRequest,
    token: str | None,
    plan: PullPlan,
    progress: PullProgress,
    present: set[str],
    cancel: threading.Event,
    workers: int,
    report_every_s: float,
    on_progress: Callable[[ProgressReport], None] | None,
) -> BaseException | None:
    """Download the plan's files on `workers` threads, reporting every `report_every_s`;
    the first failure (Ctrl-C: PullCancelled) stops the rest and is returned."""
    commit = plan.listing.commit

    def one(name: str) -> None:
        _fetch_one(req, token, commit, name, progress, present, cancel)

    # small files first: config and tokenizer are there early, and an error shows at once
    names = sorted((f.name for f in plan.selection.files), key=lambda n: _size(plan, n))
    pool = cf.ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="vsup-pull")
    futures = {pool.submit(one, n): n for n in names}
    failure: BaseException | None = None
    try:
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, timeout=report_every_s, return_when=cf.FIRST_EXCEPTION)
            for fut in done:
                exc = fut.exception()
                if exc is not None and failure is None:
                    failure = exc
                    cancel.set()  # the other downloads stop at their next chunk
            if on_progress is not None:
                on_progress(progress.report())
    except KeyboardInterrupt:
        cancel.set()
        failure = PullCancelled("interrupted (Ctrl-C)")
        cf.wait(futures)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return failure


def _fetch_one(
    req: PullRequest,
    token: str | None,
    commit: str,
    name: str,
    progress: PullProgress,
    present: set[str],
    cancel: threading.Event,
) -> None:
    if cancel.is_set():
        raise PullCancelled()
    if name not in present:
        progress.started(name)
    try:
        # a file already present is linked into this snapshot without a download
        _download(req, name, commit, token, tqdm_class=progress.bar_class(name))
    except BaseException:
        progress.failed(name)
        raise
    progress.finished(name, fetched=name not in present)


def _complete(req: PullRequest, plan: PullPlan) -> None:
    """Point the revision at the pulled commit; refuse a snapshot vLLM could not start from;
    write the manifest."""
    commit = plan.listing.commit
    cache_mod.write_ref(req.cache_dir, req.model, req.rev, commit)
    missing = cache_mod.missing_for_start(plan.snapshot)
    if missing:
        raise PullError(
            "error",
            f"{req.label}: the pulled snapshot {plan.snapshot} lacks {', '.join(missing)}, so "
            "vLLM could not start from it (is this a model repository vLLM serves?)",
        )
    # the manifest only spares a later check; the snapshot is complete without it
    with contextlib.suppress(OSError):
        cache_mod.write_manifest(req.model, commit, (f.name for f in plan.selection.files))


def _size(plan: PullPlan, name: str) -> int:
    for f in plan.selection.files:
        if f.name == name:
            return f.size or 0
    return 0
