"""The bench sequence: for each layout apply it, wait until every instance is ready, run one
vLLM client per instance (started together), record vsup's telemetry meanwhile; at the end,
and on Ctrl-C, SIGTERM or SIGHUP (bench/guard.py turns them into KeyboardInterrupt), restore
what ran before.

Problems of one layout (it does not validate on this node, an instance does not come up, a
client fails, an instance dies mid-run) are recorded in its run and the next layout runs; the
original layout comes back in every case.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vsup.bench import results as res
from vsup.bench.client import (
    ClientPool,
    ClientRun,
    client_argv,
    client_env,
    client_flags,
    equivalent_command,
    find_vllm_python,
)
from vsup.bench.guard import LayoutGuard
from vsup.bench.publish import ProgressPublisher
from vsup.bench.sampler import Sampler, summarize
from vsup.bench.split import split_prompts, split_rate, weights_for
from vsup.bench.workload import Workload
from vsup.control.errors import ControlError, DaemonUnavailable
from vsup.layout.spec import InstanceSpec
from vsup.progress import Progress, fmt_duration, wait_ready
from vsup.snapshot import InstanceStatus, StatusSnapshot
from vsup.states import RolloutState, State

if TYPE_CHECKING:
    from vsup.answers import ApplyPlan
    from vsup.control.client import Client

# How long the clients may take to import vLLM and parse their flags before the barrier.
CLIENT_START_TIMEOUT_S = 300.0


@dataclass
class LayoutToRun:
    """A layout file as read and checked here; `errors` non-empty means it is not run."""

    path: Path
    name: str
    toml: str
    specs: list[InstanceSpec] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class Original:
    """What ran before the bench, to restore."""

    toml: str | None
    path: str | None
    name: str | None
    serving: list[str]
    daemon_was_running: bool
    idle: list[str] = field(default_factory=list)  # stopped or failed before: stopped again

    def to_json(self) -> dict[str, Any]:
        """As the layout lease keeps it (vsup/lease.py)."""
        return {
            "toml": self.toml,
            "path": self.path,
            "name": self.name,
            "serving": list(self.serving),
            "daemon_was_running": self.daemon_was_running,
            "idle": list(self.idle),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Original:
        return cls(
            toml=doc.get("toml"),
            path=doc.get("path"),
            name=doc.get("name"),
            serving=list(doc.get("serving") or ()),
            daemon_was_running=bool(doc.get("daemon_was_running", True)),
            idle=list(doc.get("idle") or ()),
        )


@dataclass
class BenchRunner:
    client: Client
    make_client: Callable[[], Client]  # a second client for the sampler's thread
    workload: Workload
    out_dir: Path
    ready_timeout: float = 1200.0
    run_timeout: float = 3600.0
    keep: bool = False
    poll_interval: float = 1.0
    say: Callable[[str], None] = print
    progress: Progress = field(default_factory=Progress)
    # tells the daemon (and so the dashboard) the phase; bench/publish.py
    publisher: ProgressPublisher | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    _clients: list[ClientRun] = field(default_factory=list)
    # the client processes, kept from one layout (or tune step) to the next: vLLM is imported
    # once per instance, not once per run; `close_clients` ends them
    pool: ClientPool = field(default_factory=ClientPool)
    _sampler: Sampler | None = None
    _applied: str | None = None  # the last layout this bench applied
    # signals, output and the layout lease (bench/guard.py); its `restoring` lets a restore
    # finish whatever signal comes
    guard: LayoutGuard | None = None
    _restoring: bool = False

    @property
    def restoring(self) -> bool:
        return self.guard.restoring if self.guard is not None else self._restoring

    @restoring.setter
    def restoring(self, value: bool) -> None:
        if self.guard is not None:
            self.guard.restoring = value
        self._restoring = value

    # -- the whole sequence ------------------------------------------------------------------

    def run(self, layouts: list[LayoutToRun], original: Original) -> dict[str, Any]:
        """Run every layout, restore, and return the run document (see report.py)."""
        started = _now()
        interrupted = False
        restore: dict[str, Any] = {}
        if self.publisher is not None:
            self.publisher.start()
        try:
            for k, lay in enumerate(layouts, 1):
                try:
                    self.run_layout(k, len(layouts), lay)
                except ControlError as exc:
                    # The daemon refused this layout (e.g. it is shutting down): say so, go on.
                    self._abort_current()
                    run = self.runs[-1]
                    run["outcome"] = "failed"
                    run["problems"].append(f"the daemon refused it: {exc.message}")
                    self.say(f"[{k}/{len(layouts)}] {lay.name}: the daemon refused it: {exc}")
        except KeyboardInterrupt as exc:
            interrupted = True
            self.restoring = True  # a second signal must not cut the clean-up short
            why = getattr(exc, "why", None) or "interrupted (Ctrl-C or SIGTERM)"
            if self.runs and self.runs[-1]["outcome"] == "running":
                self.runs[-1]["outcome"] = "interrupted"
                self.runs[-1]["problems"].append(why)
            self.progress.clear()
            self.say(f"{why}: stopping the clients, then restoring the original layout")
            self._abort_current()
        finally:
            self.progress.clear()
            self.close_clients()
            try:
                restore = self.restore(original)
            finally:
                if self.publisher is not None:
                    self.publisher.close()
        return self.document(started, original, restore, interrupted)

    def _phase(self, phase: str, **where: Any) -> None:
        """Tell the daemon (the dashboard) which phase the bench is in."""
        if self.publisher is not None:
            self.publisher.phase(phase, **where)

    def document(
        self, started: str, original: Original, restore: dict, interrupted: bool
    ) -> dict[str, Any]:
        from vsup import __version__
        from vsup.bench.report import SCHEMA, ratio_to_first

        ratio_to_first(self.runs)
        reported = (
            (i.get("client") or {}).get("vllm_version")
            for r in self.runs
            for i in r.get("instances", ())
        )
        versions = {v for v in reported if v is not None}
        return {
            "schema": SCHEMA,
            "vsup_version": __version__,
            "vllm_version": ", ".join(sorted(versions)) or None,
            "started_at": started,
            "ended_at": _now(),
            "workload": self.workload.to_json(),
            "original_layout": {"name": original.name, "path": original.path},
            "restore": restore,
            "interrupted": interrupted,
            "out_dir": str(self.out_dir),
            "runs": self.runs,
        }

    # -- one layout ------------------------------------------------------------------------

    def run_layout(self, k: int, n: int, lay: LayoutToRun) -> dict[str, Any]:
        tag = f"[{k}/{n}] {lay.name}"
        run: dict[str, Any] = {
            "layout": {"name": lay.name, "path": str(lay.path)},
            "outcome": "invalid",
            "problems": [],
            "instances": [],
            "totals": None,
        }
        self.runs.append(run)
        if lay.errors:
            run["problems"] = [f"does not validate: {e}" for e in lay.errors]
            self.say(f"{tag}: skipped, it does not validate ({lay.errors[0]})")
            return run
        dry = self.client.apply(lay.toml, str(lay.path), dry_run=True)
        if dry.errors:
            errs = [str(e) for e in dry.errors]
            run["problems"] = [f"does not validate on this node: {e}" for e in errs]
            self.say(f"{tag}: skipped, it does not validate on this node ({errs[0]})")
            return run
        self.say(f"{tag}: applying ({_plan_words(dry.plan)})")
        where = {"layout": lay.name, "index": k, "count": n}
        self._phase("applying", **where)
        t0 = time.monotonic()
        run["outcome"] = "running"
        self._applied = lay.name
        # a bench layout replaces the last one whole: rolling waves would only stretch the switch
        answer = self.client.apply(lay.toml, str(lay.path), all_at_once=True)
        run["plan"] = answer.plan.to_json() if answer.plan is not None else None
        names = [s.name for s in lay.specs]
        self.say(f"{tag}: waiting until {len(names)} instance(s) are ready")
        self._phase("waiting_ready", **where)
        # Removed instances must be gone too: they would share the node (CPU, HBM) with the
        # layout under test.
        self._wait_stopped(answer.plan.stop if answer.plan is not None else ())
        ok, doc = self._wait_ready(names, f"{tag}: waiting ready ")
        run["ready_after_s"] = round(time.monotonic() - t0, 1)
        if not ok:
            run["outcome"] = "not_ready"
            run["problems"] += _not_ready(doc, names, run["ready_after_s"])
            self.say(f"{tag}: not every instance became ready; this layout is not loaded")
            return run
        self.say(f"{tag}: ready after {fmt_duration(run['ready_after_s'])}")
        by_name = {i.name: i for i in doc.instances}
        self._load(tag, k, lay, run, [by_name[nm] for nm in names], where)
        return run

    def _wait_ready(self, names: list[str], label: str = "") -> tuple[bool, StatusSnapshot]:
        deadline = time.monotonic() + self.ready_timeout
        # the terminal's live line names the layout and the phase before the instances' states
        progress = _Labelled(self.progress, label)
        while True:
            ok, doc = wait_ready(
                self.client, names, max(1.0, deadline - time.monotonic()), progress
            )
            # A rolling apply (where the daemon does them) is over only when its last wave is.
            rolling = doc.rollout is not None and doc.rollout.state == RolloutState.RUNNING
            if not ok or not rolling or time.monotonic() >= deadline:
                return ok and not rolling, doc
            time.sleep(0.5)

    def _wait_stopped(self, names: Iterable[str]) -> None:
        """Wait (up to the ready timeout) until `names` are stopped or gone from the status."""
        names = set(names)
        deadline = time.monotonic() + self.ready_timeout
        while names and time.monotonic() < deadline:
            insts = self.client.status().instances
            if not any(i.name in names and i.lifecycle.state != State.STOPPED for i in insts):
                return
            time.sleep(0.3)

    def _load(
        self,
        tag: str,
        k: int,
        lay: LayoutToRun,
        run: dict,
        insts: list[InstanceStatus],
        where: dict[str, Any],
    ) -> None:
        folder = self.out_dir / f"{k:02d}-{_safe(lay.name)}"
        folder.mkdir(parents=True, exist_ok=True)
        run["instances"], run["split_basis"] = self._clients_for(lay, insts, folder)
        records = run["instances"]
        split = ", ".join(f"{r['name']} {r['prompts']}" for r in records)
        self.say(f"{tag}: starting {len(self._clients)} vLLM client(s) (prompts: {split})")
        self._phase("warming", requests_total=sum(c.total for c in self._clients), **where)
        with self.guard.deferred() if self.guard is not None else contextlib.nullcontext():
            for c in self._clients:
                # an interrupt waits: a client half started would be left running
                self.pool.start(c)
        started = self._barrier(tag)
        for c in self._clients:
            if c not in started:
                c.stop()
        poller = self.make_client()
        # the samples are the status documents (summarize reads them as JSON)
        self._sampler = Sampler(poller.status_json, interval=self.poll_interval)
        self._sampler.sample()
        self._sampler.start()
        for c in started:
            c.go()
        self.say(f"{tag}: running")
        self._follow(tag, started, where)
        self._phase("collecting", requests_total=sum(c.total for c in started), **where)
        if self.publisher is not None:
            self.publisher.requests(
                sum(c.done_requests for c in started), sum(c.total for c in started)
            )
        # The daemon scrapes once a poll: wait for the counters to catch up with the end.
        time.sleep(2 * self.poll_interval + 0.2)
        self._sampler.stop()
        self._sampler.sample()
        poller.close()
        self._record(run, records)
        t = run["totals"]
        self.say(
            f"{tag}: done: {t['completed']}/{t['prompts']} requests, "
            f"{_num(t['output_throughput'])} output tok/s, {t['failed']} failed"
            + (f", {len(run['problems'])} problem(s)" if run["problems"] else "")
        )

    def _clients_for(
        self, lay: LayoutToRun, insts: list[InstanceStatus], folder: Path
    ) -> tuple[list[dict[str, Any]], str]:
        """The layout's prompts and rate split over its instances (`self._clients`: a vLLM
        client per instance with a share); the run's records of them, and the split's basis."""
        specs = {s.name: s for s in lay.specs}
        weights, basis = weights_for(insts)
        shares = split_prompts(self.workload.num_prompts, weights)
        rates = split_rate(self.workload.request_rate, shares)
        self._clients = []
        records = []
        for idx, (inst, share, rate, weight) in enumerate(
            zip(insts, shares, rates, weights, strict=True)
        ):
            spec = specs[inst.name]
            rec: dict[str, Any] = {
                "name": spec.name,
                "gpus": list(spec.gpus),
                "port": spec.port,
                "model": spec.model,
                "weight": weight,
                "prompts": share,
                "request_rate": rate,
                "seed": self.workload.seed + idx,
                "client": None,
                "telemetry": None,
            }
            records.append(rec)
            if share > 0:
                c, rec["client"] = self._client_run(spec, share, rate, idx, folder)
                self._clients.append(c)
        return records, basis

    def _client_run(
        self, spec: InstanceSpec, share: int, rate: float, idx: int, folder: Path
    ) -> tuple[ClientRun, dict[str, Any]]:
        """The vLLM client for one instance's share, and its record."""
        py = find_vllm_python(spec)
        flags = client_flags(
            spec,
            self.workload.client_flags(share, rate, self.workload.seed + idx),
            folder,
            f"{_safe(spec.name)}.json",
        )
        c = ClientRun(
            instance=spec.name,
            argv=client_argv(py.python, flags),
            env=client_env(spec),
            log_path=folder / f"{_safe(spec.name)}.log",
            result_path=folder / f"{_safe(spec.name)}.json",
            total=share,
            flags=flags,
        )
        return c, {
            "python": py.python,
            "python_from": py.how,
            "argv": c.argv,
            "command": c.command_line,
            "equivalent": equivalent_command(flags),
            "log": str(c.log_path),
            "result_file": str(c.result_path),
        }

    def _barrier(self, tag: str) -> list[ClientRun]:
        """Wait until every client imported vLLM and parsed its flags (or ended, or the time
        ran out); the ones at the barrier, which `go` starts together."""
        t0 = time.monotonic()
        deadline = t0 + CLIENT_START_TIMEOUT_S
        clients = self._clients
        while time.monotonic() < deadline:
            if all(c.ready.is_set() or c.poll() is not None for c in clients):
                break
            loaded = sum(1 for c in clients if c.ready.is_set())
            self.progress.update(
                f"{tag}: warming: {loaded}/{len(clients)} client(s) loaded vLLM, "
                f"{fmt_duration(time.monotonic() - t0)}"
            )
            time.sleep(0.2)
        self.progress.clear()
        return [c for c in clients if c.ready.is_set()]

    def _follow(self, tag: str, clients: list[ClientRun], where: dict[str, Any]) -> None:
        t0 = time.monotonic()
        total = sum(c.total for c in clients)
        last_line = t0  # into a pipe: a line each 15 s, the first after 15 s
        measuring = False
        while any(c.poll() is None for c in clients):
            elapsed = time.monotonic() - t0
            if elapsed > self.run_timeout:
                self.progress.clear()
                self.say(f"{tag}: the clients ran past {self.run_timeout:.0f} s; stopping them")
                for c in clients:
                    c.stop()
                break
            done = sum(c.done_requests for c in clients)
            if not measuring and all(c.measuring or c.poll() is not None for c in clients):
                # every client is past its test request: the measured run goes on
                measuring = True
                self._phase("running", requests_total=total, **where)
            if self.publisher is not None:
                self.publisher.requests(done, total)
            what = "running" if measuring else "warming (the clients' test request)"
            line = f"{tag}: {what} {fmt_duration(elapsed)}, requests done {done}/{total}"
            if self.progress.live:
                self.progress.update(line)
            elif time.monotonic() - last_line >= 15:
                self.say(line)
                last_line = time.monotonic()
            time.sleep(0.25)
        self.progress.clear()
        for c in clients:
            try:
                c.wait(30)
            except Exception:
                c.stop()

    def _record(self, run: dict, records: list[dict]) -> None:
        assert self._sampler is not None
        starts = [c.started_at for c in self._clients if c.started_at]
        ends = [c.ended_at for c in self._clients if c.ended_at]
        # The rates vsup shows lag a poll behind: one interval past the end still counts.
        window = (min(starts), max(ends) + self.poll_interval) if starts and ends else None
        tel = summarize(self._sampler.samples, [r["name"] for r in records], window)
        by_client = {c.instance: c for c in self._clients}
        results: list[dict | None] = []
        prompts: list[int] = []
        for rec in records:
            rec["telemetry"] = tel["instances"].get(rec["name"])
            died = (rec["telemetry"] or {}).get("died")
            if died:
                why = f" ({died['reason']})" if died.get("reason") else ""
                line = f": {died['log_line']}" if died.get("log_line") else ""
                run["problems"].append(
                    f"{rec['name']} stopped serving during the run: {died['state']}{why}{line}"
                )
            c = by_client.get(rec["name"])
            if c is None:
                continue
            results.append(_client_result(c, rec, run["problems"]))
            prompts.append(rec["prompts"])
        run["gpus"] = [
            g for g in tel["gpus"] if any(g["index"] in (r.get("gpus") or ()) for r in records)
        ]
        run["totals"] = _totals(results, prompts, [r["telemetry"] or {} for r in records])
        run["telemetry_samples"] = len(self._sampler.samples)
        if not any(results):
            run["outcome"] = "failed"
        elif run["problems"]:
            run["outcome"] = "partial"
        else:
            run["outcome"] = "ok"

    def close_clients(self) -> None:
        """End the client processes kept for the next run (the bench or the search is over)."""
        self.pool.close()

    def _abort_current(self) -> None:
        for c in self._clients:
            c.stop(grace=2.0)
        if self._sampler is not None:
            self._sampler.stop()

    # -- restore ---------------------------------------------------------------------------

    def restore_from(self, original: Original, applied: str) -> dict[str, Any]:
        """Put back what ran before a bench that is gone applied `applied` (`--restore`)."""
        self._applied, self.keep = applied, False
        return self.restore(original)

    def restore(self, original: Original) -> dict[str, Any]:
        """Put back what ran before (or keep the last layout with `keep`).

        Over a client of its own: a signal raises `Interrupted` in the main thread wherever it
        is, also inside a request of `self.client`, whose connection pool is then not to be
        trusted with the one request that must not hang."""
        self.restoring = True
        interrupted_client, self.client = self.client, self.make_client()
        try:
            if self._applied and self.keep:
                self.say(f"keeping layout {self._applied} (--keep)")
                return {"outcome": "kept", "layout": self._applied}
            if self._applied and original.toml:
                return self._restore_layout(original, original.toml)
            if not original.daemon_was_running:
                self._phase("restoring", layout=None)
                if self._applied:
                    self.say("nothing ran before the bench: stopping its instances and the daemon")
                self.client.shutdown(stop_instances=True)
                _wait_daemon_gone(self.client, 300)
                return {"outcome": "daemon_stopped"}
            if self._applied:
                self.say("no layout ran before the bench: stopping its instances")
                self._phase("restoring", layout=None)
                self.client.action("stop", all=True)
                return {"outcome": "stopped"}
            return {"outcome": "untouched"}
        except (ControlError, DaemonUnavailable) as exc:
            self.say(f"could not restore the original layout: {exc}")
            return {"outcome": "failed", "error": str(exc)}
        finally:
            self.restoring = False
            restore_client, self.client = self.client, interrupted_client
            with contextlib.suppress(Exception):
                restore_client.close()

    def _restore_layout(self, original: Original, toml: str) -> dict[str, Any]:
        """Apply the original layout again, its instances down as they were before, and wait
        for the serving ones (or stop the daemon when the bench started it)."""
        self.say(f"restoring the original layout {original.name}")
        self._phase("restoring", layout=original.name)
        answer = self.client.apply(toml, original.path)
        self._wait_stopped(answer.plan.stop if answer.plan is not None else ())
        if original.idle:
            # applying the layout starts every instance of it; those that were down
            # before the bench go down again rather than serve unasked
            self.client.action("stop", names=original.idle)
        if not original.daemon_was_running and not original.serving:
            self.say(f"layout {original.name} is loaded again; stopping the daemon")
            self.client.shutdown(stop_instances=True)
            _wait_daemon_gone(self.client, 300)
            return {"outcome": "restored", "layout": original.name, "daemon": "stopped"}
        ok, doc = self._wait_ready(original.serving, "restoring: ")
        if not ok:
            states = {i.name: i.lifecycle.state for i in doc.instances}
            not_ready = {n: states.get(n) for n in original.serving if states.get(n) != State.READY}
            self.say(f"the original layout is back but not ready: {not_ready}")
            return {
                "outcome": "restored_not_ready",
                "layout": original.name,
                "not_ready": not_ready,
            }
        self.say(f"the original layout {original.name} is back")
        return {"outcome": "restored", "layout": original.name}


class _Labelled(Progress):
    """A Progress whose lines start with a label (which layout, which phase)."""

    def __init__(self, progress: Progress, label: str) -> None:
        super().__init__(progress.stream, progress.live)
        self.progress = progress
        self.label = label

    def update(self, text: str) -> None:
        self.progress.update(self.label + text)

    def clear(self) -> None:
        self.progress.clear()


def _wait_daemon_gone(client: Client, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.status()
        except DaemonUnavailable:
            return
        time.sleep(0.2)


def _plan_words(plan: ApplyPlan | None) -> str:
    words = []
    for key in ("start", "restart", "stop", "update", "unchanged"):
        names = getattr(plan, key) if plan is not None else ()
        if names:
            words.append(f"{key} {', '.join(names)}")
    return "; ".join(words) or "no change"


def _not_ready(doc: StatusSnapshot, names: list[str], after_s: float) -> list[str]:
    """A problem line for each of `names` that is not ready in `doc`."""
    by_name = {i.name: i for i in doc.instances}
    out = []
    for name in names:
        inst = by_name.get(name)
        if inst is not None and inst.lifecycle.state == State.READY:
            continue
        le = inst.lifecycle.last_exit if inst is not None else None
        why = f" (last exit: {le.reason})" if le is not None and le.reason else ""
        state = inst.lifecycle.state if inst is not None else "missing"
        out.append(f"{name}: {state}{why} after {after_s:.0f} s; not loaded")
    return out


def _client_result(c: ClientRun, rec: dict[str, Any], problems: list[str]) -> dict | None:
    """A finished vLLM client's result (None when it failed), its exit and summary written
    into its record and what went wrong into `problems`."""
    result = c.result() if c.poll() == 0 else None
    rec["client"]["exit_code"] = c.poll()
    rec["client"]["vllm_version"] = c.vllm_version
    rec["client"]["reused_process"] = c.reused  # no vLLM import: an earlier run's process
    rec["client"]["started_at"] = c.started_at
    rec["client"]["ended_at"] = c.ended_at
    if result is None:
        why = c.failure() if c.ready.is_set() else ("it did not start: " + c.failure())
        rec["client"]["error"] = why
        problems.append(f"{rec['name']}: the vLLM client failed: {why}")
    else:
        rec["client"]["error"] = None
        rec["client"]["summary"] = res.client_summary(result)
        if result.get("failed"):
            problems.append(
                f"{rec['name']}: {result['failed']} request(s) failed (log: {rec['client']['log']})"
            )
    return result


def _totals(results: list[dict | None], prompts: list[int], per: list[dict]) -> dict[str, Any]:
    """The layout's figures: the clients' results pooled, and vsup's telemetry summed."""
    totals = res.pool(results, prompts)
    totals["preemptions"] = _sum([p.get("preemptions") for p in per])
    totals["kv_peak"] = max(
        (p["kv_peak"] for p in per if p.get("kv_peak") is not None), default=None
    )
    totals["tokens_per_s_vsup"] = _sum([p.get("tokens_per_s_mean") for p in per])
    hbm = [p.get("hbm_peak_bytes") for p in per]
    totals["hbm_peak_bytes"] = sum(hbm) if hbm and all(h is not None for h in hbm) else None
    return totals


def _sum(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "x"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
