"""Alerts that reach a person: the advice and daemon events a layout's `[alerts]` chose, sent to
a webhook (Slack-compatible `{"text": ...}`) and/or a command, once per incident.

```toml
[alerts]
webhook_env = "VSUP_ALERT_WEBHOOK"   # the daemon's variable holding the URL (a secret)
command = ["/usr/local/bin/page-oncall"]   # gets the alert as JSON on stdin
kinds = ["crash_loop", "failed", "gpu_health"]   # default: all of ALERT_KINDS
min_severity = "warning"    # advice below it is not sent
min_interval_s = 300        # the same alert is not sent again sooner
resolve_after_s = 60        # clear this long before "resolved" is sent (flapping stays one alert)
resolved = true
```
An incident is one advice key (advice kind, instance, GPU). It is sent when it appears (unless the
same key was sent less than `min_interval_s` ago: then when that interval has passed, if it is
still there) and again when its severity rises; while it lasts nothing more is sent; once it has
been absent for `resolve_after_s`, "resolved" is sent.

Delivery: `observe()` runs on the daemon's loop and only queues. Each target (the webhook, the
command) has a queue and a worker of its own, so a target that hangs (a command that sleeps
until its `COMMAND_TIMEOUT_S`, a webhook that never answers) delays only its own alerts. A
failed delivery is logged and put back in its target's queue after `retry_delays_s`. A target
more than `QUEUE_MAX` alerts behind drops its oldest waiting one, logged with its text (and
counted in `dropped`): the others keep arriving in time.

The command runs with a clean environment: PATH, HOME, LANG/LC_*, TZ, USER, LOGNAME and the
alert's own `VSUP_ALERT_*` variables; never the daemon's secrets (the API key's variable,
HF_TOKEN, the webhook URL's variable). A command that needs a credential reads it itself.

What was sent survives a daemon restart: the open incidents and when each key was last sent
are kept in `state_path` (`$VSUP_HOME/alerts.json`), so a new daemon does not page again for an
incident already paged (it still sends "resolved" when the incident clears).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vsup.clock import Clock, iso_utc
from vsup.fsutil import write_atomic
from vsup.layout.alertconfig import AlertConfig
from vsup.layout.schema import SEVERITIES
from vsup.snapshot import Advice

log = logging.getLogger(__name__)

# advice kind -> alert kind (what `[alerts] kinds` names)
ADVICE_KINDS = {
    "crash_loop": "crash_loop",
    "failed": "failed",
    "pull_failed": "failed",  # instances a failed pull kept from starting
    "router_failed": "failed",
    "kv_exhausted": "preempting",
    "gpu_ecc": "gpu_health",
    "gpu_memory": "gpu_health",
    "gpu_xid": "gpu_health",
    "gpu_throttle": "gpu_health",
    "stalled": "stalled",
    "router_foreign_worker": "router_foreign_worker",
    "router_worker_removed": "router_worker_removed",
    "canary_rolled_back": "canary_rolled_back",
}
RESOLVED = "resolved"  # an alert's `state` once its advice has been clear for resolve_after_s
RETRY_DELAYS_S = (10.0, 60.0, 300.0)
QUEUE_MAX = 256  # alerts waiting for one target; beyond it its oldest is dropped (and logged)
COMMAND_TIMEOUT_S = 30.0
WEBHOOK_TIMEOUT_S = 10.0
# What the alert command inherits of the daemon's environment (LC_* too): enough to run a
# program and format text, nothing that could be a credential.
COMMAND_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME")
STATE_VERSION = 1


@dataclass
class _Incident:
    advice: Advice
    alert_kind: str
    last_seen: float
    sent_severity: str | None = None  # None: not sent yet (held back by min_interval_s)


@dataclass
class Delivery:
    """One message for every target: `payload` (the command's stdin) and its `text`."""

    payload: dict[str, Any]
    attempts: dict[str, int] = field(default_factory=dict)  # target -> failed attempts

    @property
    def text(self) -> str:
        return self.payload["text"]


class _Lane:
    """One target's queue and worker: a slow or hung target holds up only its own alerts."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.busy = False
        self.retries: set[asyncio.Task] = set()

    @property
    def idle(self) -> bool:
        return self.queue.empty() and not self.busy and not self.retries


class Alerts:
    """Turns advice into alert deliveries. Create it on the daemon's loop, `start()` it, feed it
    each snapshot's advice with `observe()`, `configure()` it on every apply."""

    def __init__(
        self,
        clock: Clock,
        node: str,
        *,
        env: Mapping[str, str] | None = None,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        webhook_timeout_s: float = WEBHOOK_TIMEOUT_S,
        state_path: Path | None = None,
    ) -> None:
        self.clock = clock
        self.node = node
        self._env = env
        self.retry_delays_s = retry_delays_s
        self.command_timeout_s = command_timeout_s
        self.webhook_timeout_s = webhook_timeout_s
        self.state_path = Path(state_path) if state_path is not None else None
        self.config: AlertConfig | None = None
        self._incidents: dict[tuple, _Incident] = {}
        self._last_sent: dict[tuple, float] = {}
        self._lanes: dict[str, _Lane] = {}
        self._started = False
        self._persist: asyncio.Task | None = None
        self._saving: asyncio.Future[bool] | None = None  # the persist loop's write in flight
        self._dirty = asyncio.Event()
        self._http: httpx.AsyncClient | None = None
        self.delivered = 0
        self.failed = 0  # failed attempts (each retry counts)
        self.dropped = 0  # alerts a target's full queue dropped
        self.idle = asyncio.Event()  # set when nothing is queued, being sent or waiting a retry
        self.idle.set()
        self._load()

    # ------------------------------------------------------------------ config and input

    def configure(self, config: AlertConfig | None) -> None:
        """Take a new `[alerts]` config (None: alerts off). Open incidents of kinds it still
        sends carry over; the others are forgotten without a "resolved" they did not earn."""
        self.config = config
        for key, inc in list(self._incidents.items()):
            if config is None or inc.alert_kind not in config.kinds:
                del self._incidents[key]
                self._dirty.set()

    def observe(self, advice: Iterable[Advice]) -> None:
        """One poll's advice: send what appeared, escalated or cleared. Never blocks."""
        cfg = self.config
        if cfg is None:
            return
        now = self.clock.monotonic()
        floor = SEVERITIES.index(cfg.min_severity) if cfg.min_severity in SEVERITIES else 1
        seen = set()
        for a in advice:
            alert_kind = ADVICE_KINDS.get(a.kind)
            if alert_kind is None or alert_kind not in cfg.kinds:
                continue
            if _rank(a.severity) < floor:
                continue
            key = (a.kind, a.instance, a.gpu)
            seen.add(key)
            inc = self._incidents.get(key)
            if inc is None:
                inc = self._incidents[key] = _Incident(a, alert_kind, now)
            inc.advice, inc.last_seen = a, now
            escalated = inc.sent_severity is not None and _rank(a.severity) > _rank(
                inc.sent_severity
            )
            last = self._last_sent.get(key)
            due = inc.sent_severity is None and (last is None or now - last >= cfg.min_interval_s)
            if due or escalated:
                inc.sent_severity = a.severity
                self._last_sent[key] = now
                self._dirty.set()
                self._send("firing", alert_kind, a)
        for key, inc in list(self._incidents.items()):
            if key in seen or now - inc.last_seen < cfg.resolve_after_s:
                continue
            del self._incidents[key]
            if inc.sent_severity is not None:
                self._dirty.set()
                if cfg.resolved:
                    self._send("resolved", inc.alert_kind, inc.advice)
        # a key sent longer ago than the interval no longer holds anything back
        for key, t in list(self._last_sent.items()):
            if now - t >= cfg.min_interval_s and key not in self._incidents:
                del self._last_sent[key]

    def notify(self, alert_kind: str, message: str, severity: str = "warning") -> None:
        """A one-off alert (e.g. `daemon_restarted`): sent when its kind is chosen."""
        cfg = self.config
        if cfg is None or alert_kind not in cfg.kinds:
            return
        self._send(
            "firing", alert_kind, Advice(kind=alert_kind, severity=severity, message=message)
        )

    def _send(self, state: str, alert_kind: str, advice: Advice) -> None:
        head = "RESOLVED" if state == RESOLVED else advice.severity.upper()
        payload = {
            "text": f"[vsup {self.node}] {head} {alert_kind}: {advice.message}",
            "state": state,
            "kind": alert_kind,
            "advice_kind": advice.kind,
            "severity": advice.severity,
            "instance": advice.instance,
            "gpu": advice.gpu,
            "message": advice.message,
            "node": self.node,
            "at": iso_utc(self.clock.wall()),
        }
        for target in self._targets():
            self._enqueue(self._lane(target), Delivery(payload))

    def _enqueue(self, lane: _Lane, item: Delivery) -> None:
        if lane.queue.qsize() >= QUEUE_MAX:
            dropped = lane.queue.get_nowait()
            self.dropped += 1
            log.error("alerts: %s is %d alerts behind; dropped: %s", lane.target, QUEUE_MAX,
                      dropped.text)  # fmt: skip
        self.idle.clear()
        lane.queue.put_nowait(item)

    def _lane(self, target: str) -> _Lane:
        lane = self._lanes.get(target)
        if lane is None:
            lane = self._lanes[target] = _Lane(target)
            if self._started:
                self._start_lane(lane)
        return lane

    # ------------------------------------------------------------------ delivery

    async def start(self) -> None:
        self._started = True
        for lane in self._lanes.values():
            self._start_lane(lane)
        if self._persist is None and self.state_path is not None:
            self._persist = asyncio.create_task(self._persist_loop(), name="alerts state")

    def _start_lane(self, lane: _Lane) -> None:
        if lane.worker is None:
            lane.worker = asyncio.create_task(
                self._deliver_loop(lane), name=f"alerts {lane.target}"
            )

    async def aclose(self) -> None:
        """Stop delivering (what is still queued or waiting for a retry is dropped); what was
        sent is written to the state file first."""
        tasks = [t for lane in self._lanes.values() for t in (lane.worker, *lane.retries) if t]
        if self._persist is not None:
            tasks.append(self._persist)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for lane in self._lanes.values():
            lane.worker = None
        self._persist = None
        self._started = False
        # A write the persist loop began runs on in its thread when the loop is cancelled: wait
        # for it, so that the last state is written last (not overtaken by an older document).
        saving, self._saving = self._saving, None
        if saving is not None and not await _outcome(saving):
            self._dirty.set()
        if self._dirty.is_set():
            await asyncio.to_thread(self._save, self._state_doc())
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _deliver_loop(self, lane: _Lane) -> None:
        while True:
            item = await lane.queue.get()
            lane.busy = True
            try:
                await self._deliver(item, lane)
            except Exception:  # a bug here must not end alerting
                log.exception("alerts: delivering %r to %s failed", item.text, lane.target)
            finally:
                lane.busy = False
            self._check_idle()

    def _check_idle(self) -> None:
        if all(lane.idle for lane in self._lanes.values()):
            self.idle.set()

    def _targets(self) -> list[str]:
        cfg = self.config
        if cfg is None:
            return []
        return [t for t, on in (("webhook", cfg.webhook_env), ("command", cfg.command)) if on]

    async def _deliver(self, item: Delivery, lane: _Lane) -> None:
        target = lane.target
        if target not in self._targets():
            return  # the layout no longer names this target
        try:
            if target == "webhook":
                await self._post(item)
            else:
                await self._run(item)
        except _Permanent as exc:
            self.failed += 1
            log.error("alerts: %s not sent (%s): %s", target, exc, item.text)
            return
        except Exception as exc:
            self.failed += 1
            self._retry(item, lane, f"{type(exc).__name__}: {exc}")
            return
        self.delivered += 1

    def _retry(self, item: Delivery, lane: _Lane, why: str) -> None:
        target = lane.target
        attempt = item.attempts.get(target, 0)
        item.attempts[target] = attempt + 1
        if attempt >= len(self.retry_delays_s):
            log.error("alerts: %s gave up after %d attempts (%s): %s", target, attempt + 1, why,
                      item.text)  # fmt: skip
            return
        delay = self.retry_delays_s[attempt]
        log.warning("alerts: %s failed (%s); retrying in %.0f s", target, why, delay)

        async def later() -> None:
            await asyncio.sleep(delay)
            self._enqueue(lane, item)  # behind what came meanwhile: one delivery at a time

        task = asyncio.create_task(later(), name=f"alert retry {target}")
        lane.retries.add(task)

        def done(t: asyncio.Task) -> None:
            lane.retries.discard(t)
            self._check_idle()

        task.add_done_callback(done)

    async def _post(self, item: Delivery) -> None:
        cfg = self.config
        assert cfg is not None and cfg.webhook_env
        env = self._env if self._env is not None else os.environ
        url = env.get(cfg.webhook_env)
        if not url:
            raise _Permanent(
                f"${cfg.webhook_env} is not set in the daemon's environment: export it where "
                "the daemon starts (e.g. before `vsup up`), then restart the daemon"
            )
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.webhook_timeout_s)
        resp = await self._http.post(url, json={"text": item.text})
        if resp.status_code >= 300:
            raise RuntimeError(f"HTTP {resp.status_code} {resp.text[:200]!r}")

    def command_env(self, item: Delivery) -> dict[str, str]:
        """The alert command's environment: COMMAND_ENV (and LC_*) of the daemon's, and the
        alert as `VSUP_ALERT_*` variables. Nothing else: the daemon's environment holds the
        API key, HF_TOKEN and the webhook URL."""
        base = self._env if self._env is not None else os.environ
        env = {k: v for k, v in base.items() if k in COMMAND_ENV or k.startswith("LC_")}
        env.setdefault("PATH", os.defpath)
        env.update(
            {
                f"VSUP_ALERT_{k.upper()}": "" if v is None else str(v)
                for k, v in item.payload.items()
                if k != "text"
            }
        )
        env["VSUP_ALERT_TEXT"] = item.text
        return env

    async def _run(self, item: Delivery) -> None:
        cfg = self.config
        assert cfg is not None and cfg.command
        try:
            proc = await asyncio.create_subprocess_exec(
                *cfg.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=self.command_env(item),
                start_new_session=True,
            )
        except OSError as exc:
            raise _Permanent(f"cannot run {cfg.command[0]!r}: {exc}") from exc
        try:
            _, err = await asyncio.wait_for(
                proc.communicate(json.dumps(item.payload).encode() + b"\n"),
                self.command_timeout_s,
            )
        except (TimeoutError, asyncio.CancelledError) as exc:
            # its own session: the group goes too, nothing it started is left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise RuntimeError(
                f"{cfg.command[0]} ran over {self.command_timeout_s:.0f} s"
            ) from None
        if proc.returncode:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"{cfg.command[0]} exited {proc.returncode}: {tail[0][:200]}")

    # ------------------------------------------------------------------ what was sent

    def _state_doc(self) -> dict[str, Any]:
        """Open incidents already sent and when each key was last sent, in wall-clock time."""
        now_m, now_w = self.clock.monotonic(), self.clock.wall()
        incidents = []
        for (kind, instance, gpu), inc in self._incidents.items():
            if inc.sent_severity is None:
                continue
            a = inc.advice
            incidents.append(
                {
                    "kind": kind,
                    "instance": instance,
                    "gpu": gpu,
                    "alert_kind": inc.alert_kind,
                    "sent_severity": inc.sent_severity,
                    "severity": a.severity,
                    "message": a.message,
                }
            )
        last = [
            {"key": list(key), "at": round(now_w - (now_m - t), 3)}
            for key, t in self._last_sent.items()
        ]
        return {"version": STATE_VERSION, "incidents": incidents, "last_sent": last}

    def _save(self, doc: dict[str, Any]) -> bool:
        if self.state_path is None:
            return True
        try:
            write_atomic(self.state_path, json.dumps(doc, indent=1) + "\n", mode=0o600)
        except OSError as exc:
            log.error("alerts: cannot write %s (%s); retried at the next change", self.state_path,
                      exc.strerror or exc)  # fmt: skip
            return False
        return True

    async def _persist_loop(self) -> None:
        """Write the state file after each change (at most twice a second, in a thread)."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            self._saving = asyncio.ensure_future(asyncio.to_thread(self._save, self._state_doc()))
            saved = await asyncio.shield(self._saving)
            self._saving = None
            if not saved:
                self._dirty.set()
                await asyncio.sleep(5.0)
            await asyncio.sleep(0.5)

    def _load(self) -> None:
        """Take back what a previous daemon sent (a missing or unreadable file: nothing)."""
        if self.state_path is None:
            return
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("alerts: ignoring %s (%s): open incidents may be sent again",
                        self.state_path, exc)  # fmt: skip
            return
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            return
        now_m, now_w = self.clock.monotonic(), self.clock.wall()
        for rec in doc.get("incidents") or ():
            try:
                key = (str(rec["kind"]), rec["instance"], rec["gpu"])
                advice = Advice(
                    kind=key[0],
                    severity=str(rec["severity"]),
                    message=str(rec["message"]),
                    instance=key[1],
                    gpu=key[2],
                )
                self._incidents[key] = _Incident(
                    advice, str(rec["alert_kind"]), now_m, str(rec["sent_severity"])
                )
            except (KeyError, TypeError, ValueError):
                continue
        for rec in doc.get("last_sent") or ():
            try:
                kind, instance, gpu = rec["key"]
                ago = max(0.0, now_w - float(rec["at"]))
            except (KeyError, TypeError, ValueError):
                continue
            self._last_sent[(kind, instance, gpu)] = now_m - ago


class _Permanent(Exception):
    """A delivery that a retry cannot fix (no URL configured, no such program)."""


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 1


async def _outcome(saving: asyncio.Future[bool]) -> bool:
    """Whether a write the persist loop began succeeded (waiting for it to end)."""
    try:
        return await saving
    except Exception:
        return False
