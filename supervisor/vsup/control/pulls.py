"""The daemon's pulls: hub models fetched before the instances that load them start.

`vsup up` of a layout whose hub models are not complete in the cache is an apply in two steps
(docs/pull.md): the daemon starts one pull per model (a `python -m vsup.pull.worker` child:
huggingface_hub's downloads, progress as JSON lines), and once every pull is done it applies
the layout with each instance started from the local snapshot (`InstanceSpec.model_path`,
HF_HUB_OFFLINE=1). Until then nothing of the layout changes: running instances keep running,
new ones are registered `stopped` and their status carries the pull (`pull`). A pull that
fails leaves them so, with its reason and message (status JSON `pulls[]` and each instance's
`pull`); `vsup up` again retries it. A newer apply supersedes a pending one: pulls it still
needs go on, the others are cancelled.

Why the daemon and not the CLI: the daemon outlives the SSH session that ran `vsup up`, so a
100 GB download goes on when the operator's laptop sleeps, and the instances start by
themselves when it ends; every client (the dashboard from another session too) sees it.

Journal events (no instance; `model`, `revision`, `instances`): `pull_start` (files, bytes,
bytes to fetch, cache), `pull_progress` (each 10% of the bytes), `pull_done` (commit, snapshot,
fetched bytes, seconds), `pull_failed` (reason, message).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from vsup.clock import Clock
from vsup.journalevents import PullDoneEvent, PullFailedEvent, PullProgressEvent, PullStartEvent
from vsup.layout.spec import InstanceSpec
from vsup.pull.errors import CANCELLED
from vsup.pull.targets import PullTarget, Resolution, apply_pulled, instance_env, resolve
from vsup.snapshot import PullStatus
from vsup.states import FileState, PullState

log = logging.getLogger("vsup.pulls")

# SIGTERM to a worker, then this long before SIGKILL (a download stops at its next chunk)
STOP_GRACE_S = 5.0


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class PullJob:
    """One model's pull: its worker process and what it last reported."""

    def __init__(self, target: PullTarget, env: Mapping[str, str], clock: Clock) -> None:
        self.target = target
        self.env = dict(env)
        self.clock = clock
        self.state = "pulling"
        self.started_wall = clock.wall()
        self.started_mono = clock.monotonic()
        self.ended_mono: float | None = None
        self.plan: dict[str, Any] | None = None
        self.progress: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.reason: str | None = None
        self.message: str | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.done = asyncio.Event()
        self.cancel_why: str | None = None
        self.decile = 0  # the last 10% step journaled

    def end(self, state: str, reason: str | None = None, message: str | None = None) -> None:
        if self.done.is_set():
            return
        self.state, self.reason, self.message = state, reason, message
        self.ended_mono = self.clock.monotonic()
        self.done.set()

    def status(self) -> PullStatus:
        t = self.target
        prog = self.progress or {}
        plan = self.plan or {}
        result = self.result or {}
        end = self.ended_mono if self.ended_mono is not None else self.clock.monotonic()
        total = prog.get("bytes_total", plan.get("bytes_total"))
        done = prog.get("bytes_done")
        if done is None and plan:
            # chosen, nothing reported yet: what the cache held already
            done = (plan.get("bytes_total") or 0) - (plan.get("bytes_to_fetch") or 0)
        if self.state == PullState.DONE:
            done = total
        fetching = tuple(
            f["name"] for f in prog.get("files") or () if f["state"] == FileState.FETCHING
        )
        return PullStatus(
            model=t.model,
            revision=t.revision or "main",
            state=self.state,
            instances=t.instances,
            commit=plan.get("commit"),
            cache_dir=str(t.cache_dir),
            bytes_done=done,
            bytes_total=total,
            fetched_bytes=result.get("fetched_bytes", prog.get("fetched_bytes")),
            files_done=prog.get("files_done"),
            files_total=prog.get("files_total", len(plan.get("files") or ()) or None),
            rate_bps=prog.get("rate_bps") if self.state == PullState.PULLING else None,
            eta_s=prog.get("eta_s") if self.state == PullState.PULLING else None,
            current=fetching if self.state == PullState.PULLING else (),
            elapsed_s=round(end - self.started_mono, 1),
            started_at=_iso(self.started_wall),
            reason=self.reason,
            message=self.message,
            snapshot=result.get("snapshot"),
        )


class Pulls:
    """Every pull the daemon runs, and the apply waiting for them."""

    def __init__(
        self,
        home: Path,
        clock: Clock,
        journal: Callable[..., Any],
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        python: str = sys.executable,
    ) -> None:
        self.home = Path(home)
        self.clock = clock
        self.journal = journal
        self.spawn = spawn
        self.python = python
        self.jobs: dict[tuple[str, str, str, str], PullJob] = {}
        self._generation = 0

    # -- planning --------------------------------------------------------------------------

    def resolve(self, specs: Sequence[InstanceSpec], allow_pull: bool = True) -> Resolution:
        """Specs started from the cache where it holds the model, and the pulls still needed
        (reads the disk: call it off the event loop for big layouts)."""
        return resolve(specs, os.environ, allow_pull=allow_pull, home=self.home)

    # -- acting ----------------------------------------------------------------------------

    def begin(
        self,
        resolution: Resolution,
        then: Callable[[list[InstanceSpec]], Awaitable[None]],
    ) -> int:
        """Run the pulls `resolution` needs (a pull already under way for the same model is
        kept), then `await then(specs)` with every waiting instance started from its
        snapshot - unless a pull failed or a newer `begin`/`supersede` came first. Returns this
        apply's generation: `then` checks `is_current(it)` once it holds the apply lock, as a
        newer apply may have come in between."""
        wanted = {t.key: t for t in resolution.pulls}
        self._drop(lambda key: key not in wanted, "a newer apply does not need it")
        by_name = {s.name: s for s in resolution.specs}
        for key, target in wanted.items():
            job = self.jobs.get(key)
            if job is not None and job.state == PullState.PULLING:
                job.target = dataclasses.replace(job.target, instances=target.instances)
                continue
            spec = by_name[target.instances[0]]
            job = self.jobs[key] = PullJob(target, instance_env(spec, os.environ), self.clock)
            self.spawn(self._run(job), f"pull {target.label}")
        self._generation += 1
        self.spawn(self._then(self._generation, resolution, then), "apply after the pulls")
        return self._generation

    def is_current(self, generation: int) -> bool:
        """No apply came after the one `begin` numbered `generation`."""
        return generation == self._generation

    def supersede(self, why: str = "a newer apply does not need it") -> None:
        """An apply that needs no pull: cancel what runs, forget what ended."""
        self._drop(lambda key: True, why)
        self._generation += 1

    def _drop(self, which: Callable[[tuple[str, str, str, str]], bool], why: str) -> None:
        for key, job in list(self.jobs.items()):
            if which(key):
                if job.state == PullState.PULLING:
                    self._cancel(job, why)
                del self.jobs[key]

    def _cancel(self, job: PullJob, why: str) -> None:
        job.cancel_why = why
        if job.proc is not None and job.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                job.proc.terminate()

    async def _then(
        self,
        generation: int,
        resolution: Resolution,
        then: Callable[[list[InstanceSpec]], Awaitable[None]],
    ) -> None:
        jobs = [self.jobs[t.key] for t in resolution.pulls if t.key in self.jobs]
        await asyncio.gather(*(j.done.wait() for j in jobs))
        if generation != self._generation or len(jobs) != len(resolution.pulls):
            return  # superseded
        if not all(j.state == PullState.DONE and j.result for j in jobs):
            return  # the instances stay as they are; the statuses say why
        snapshots = {
            name: str(j.result["snapshot"])
            for j in jobs
            if j.result is not None
            for name in j.target.instances
        }
        await then(apply_pulled(resolution.specs, snapshots))

    async def _run(self, job: PullJob) -> None:
        """Run the pull worker for `job`: hand it the target, read its reports until it ends,
        and fail the job when it ended without a result."""
        logs = self.home / "logs" / "@pull"
        logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path = logs / (job.target.model.replace("/", "--") + ".log")
        proc = await self._start_worker(job, log_path)
        if proc is None:
            return
        if job.cancel_why is not None:
            self._cancel(job, job.cancel_why)
        try:
            await self._exchange(job, proc)
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.warning("pull %s: the worker's pipe broke: %s", job.target.label, exc)
        finally:
            code = await proc.wait()
        if not job.done.is_set():
            if job.cancel_why is not None:
                self._failed(job, "cancelled", f"the pull was cancelled: {job.cancel_why}")
            else:
                self._failed(
                    job,
                    "error",
                    f"the pull process ended (exit status {code}) without a result; its log: "
                    f"{log_path}",
                )

    async def _start_worker(
        self, job: PullJob, log_path: Path
    ) -> asyncio.subprocess.Process | None:
        """The worker process (`job.proc`), its stderr appended to `log_path` under a header
        line; None (the job failed) when it cannot start."""
        t = job.target
        with open(log_path, "ab") as err:
            err.write(f"--- {_iso(job.started_wall)} pull {t.label} into {t.cache_dir}\n".encode())
            err.flush()
            try:
                job.proc = await asyncio.create_subprocess_exec(
                    self.python,
                    "-m",
                    "vsup.pull.worker",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    env=job.env,
                    cwd=str(self.home),
                )
            except OSError as exc:
                self._failed(job, "error", f"cannot start the pull process: {exc}")
                return None
        return job.proc

    async def _exchange(self, job: PullJob, proc: asyncio.subprocess.Process) -> None:
        """Send the worker its target (one JSON line), then read its JSON reports line by line
        until it closes stdout; lines that are not a JSON object are skipped."""
        t = job.target
        job_doc = {
            "model": t.model,
            "revision": t.revision,
            "cache_dir": str(t.cache_dir),
            "load_format": t.load_format,
            "token_env": t.token_env,
        }
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write((json.dumps(job_doc) + "\n").encode())
        await proc.stdin.drain()
        proc.stdin.close()
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                self._on_report(job, doc)

    def _on_report(self, job: PullJob, doc: dict[str, Any]) -> None:
        t = job.target
        what: dict[str, Any] = {
            "model": t.model,
            "revision": t.revision or "main",
            "instances": list(t.instances),
        }
        event = doc.pop("event", None)
        if event == "plan":
            job.plan = doc
            self.journal(
                PullStartEvent(
                    **what,
                    commit=doc.get("commit"),
                    cache_dir=doc.get("cache_dir"),
                    files=len(doc.get("files") or ()),
                    bytes_total=doc.get("bytes_total"),
                    bytes_to_fetch=doc.get("bytes_to_fetch"),
                )
            )
        elif event == "progress":
            job.progress = doc
            total, done = doc.get("bytes_total") or 0, doc.get("bytes_done") or 0
            decile = int(10 * done / total) if total else 0
            if 0 < decile < 10 and decile > job.decile:
                job.decile = decile
                self.journal(
                    PullProgressEvent(
                        **what, bytes_done=done, bytes_total=total, rate_bps=doc.get("rate_bps")
                    )
                )
        elif event == "done":
            job.result = doc
            job.end("done")
            self.journal(
                PullDoneEvent(
                    **what,
                    commit=doc.get("commit"),
                    snapshot=doc.get("snapshot"),
                    fetched_bytes=doc.get("fetched_bytes"),
                    elapsed_s=doc.get("elapsed_s"),
                )
            )
            log.info("pulled %s: %s", t.label, doc.get("snapshot"))
        elif event == "failed":
            reason = str(doc.get("reason") or "error")
            message = str(doc.get("message") or "the pull failed")
            if reason == CANCELLED and job.cancel_why:
                message = f"the pull was cancelled: {job.cancel_why}"
            self._failed(job, reason, message)

    def _failed(self, job: PullJob, reason: str, message: str) -> None:
        if job.done.is_set():
            return
        job.end(PullState.CANCELLED if reason == CANCELLED else PullState.FAILED, reason, message)
        t = job.target
        self.journal(
            PullFailedEvent(
                model=t.model,
                revision=t.revision or "main",
                instances=list(t.instances),
                reason=reason,
                message=message,
            )
        )
        log.warning("pull %s failed (%s): %s", t.label, reason, message)

    async def shutdown(self, why: str = "the daemon stops") -> None:
        """Cancel every pull and wait for the workers (SIGKILL after STOP_GRACE_S)."""
        self._generation += 1
        running = [j for j in self.jobs.values() if j.state == PullState.PULLING]
        for job in running:
            self._cancel(job, why)
        for job in running:
            proc = job.proc
            if proc is None or proc.returncode is not None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    # -- reading ---------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return any(j.state == PullState.PULLING for j in self.jobs.values())

    def statuses(self) -> tuple[PullStatus, ...]:
        """Status JSON's `pulls`: the latest apply's pulls, running or ended."""
        return tuple(j.status() for j in self.jobs.values())

    def for_instance(self, name: str) -> PullStatus | None:
        """The pull `name` waits for, or the one that kept it from starting."""
        for job in self.jobs.values():
            if name in job.target.instances and job.state in (PullState.PULLING, PullState.FAILED):
                return job.status()
        return None
