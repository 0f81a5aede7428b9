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
been absent for `resolve_after_s`, "resolved" is sent. `observe()` runs on the daemon's loop and
only queues; one worker task delivers, and a failed delivery is logged and retried later
(`retry_delays_s`) in its own task, so neither a slow receiver nor a failing one holds up
supervision or the alerts behind it.
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
from typing import Any

import httpx

from vsup.clock import Clock, iso_utc
from vsup.layout.alertconfig import AlertConfig
from vsup.layout.schema import SEVERITIES
from vsup.snapshot import Advice

log = logging.getLogger(__name__)

# advice kind -> alert kind (what `[alerts] kinds` names)
ADVICE_KINDS = {
    "crash_loop": "crash_loop",
    "failed": "failed",
    "kv_exhausted": "preempting",
    "gpu_ecc": "gpu_health",
    "gpu_memory": "gpu_health",
    "gpu_xid": "gpu_health",
    "gpu_throttle": "gpu_health",
    "stalled": "stalled",
}
RETRY_DELAYS_S = (10.0, 60.0, 300.0)
QUEUE_MAX = 256  # alerts waiting for delivery; beyond it the oldest are dropped (and logged)
COMMAND_TIMEOUT_S = 30.0
WEBHOOK_TIMEOUT_S = 10.0


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
    ) -> None:
        self.clock = clock
        self.node = node
        self._env = env
        self.retry_delays_s = retry_delays_s
        self.command_timeout_s = command_timeout_s
        self.webhook_timeout_s = webhook_timeout_s
        self.config: AlertConfig | None = None
        self._incidents: dict[tuple, _Incident] = {}
        self._last_sent: dict[tuple, float] = {}
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._worker: asyncio.Task | None = None
        self._retries: set[asyncio.Task] = set()
        self._http: httpx.AsyncClient | None = None
        self.delivered = 0
        self.failed = 0  # failed attempts (each retry counts)
        self._busy = False
        self.idle = asyncio.Event()  # set when nothing is queued, being sent or waiting a retry
        self.idle.set()

    # ------------------------------------------------------------------ config and input

    def configure(self, config: AlertConfig | None) -> None:
        """Take a new `[alerts]` config (None: alerts off). Open incidents of kinds it still
        sends carry over; the others are forgotten without a "resolved" they did not earn."""
        self.config = config
        for key, inc in list(self._incidents.items()):
            if config is None or inc.alert_kind not in config.kinds:
                del self._incidents[key]

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
                self._send("firing", alert_kind, a)
        for key, inc in list(self._incidents.items()):
            if key in seen or now - inc.last_seen < cfg.resolve_after_s:
                continue
            del self._incidents[key]
            if inc.sent_severity is not None and cfg.resolved:
                self._send("resolved", inc.alert_kind, inc.advice)

    def notify(self, alert_kind: str, message: str, severity: str = "warning") -> None:
        """A one-off alert (e.g. `daemon_restarted`): sent when its kind is chosen."""
        cfg = self.config
        if cfg is None or alert_kind not in cfg.kinds:
            return
        self._send(
            "firing", alert_kind, Advice(kind=alert_kind, severity=severity, message=message)
        )

    def _send(self, state: str, alert_kind: str, advice: Advice) -> None:
        head = "RESOLVED" if state == "resolved" else advice.severity.upper()
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
        if self._queue.qsize() >= QUEUE_MAX:
            dropped = self._queue.get_nowait()
            log.error("alerts: queue full, dropped: %s", dropped.text)
        self.idle.clear()
        self._queue.put_nowait(Delivery(payload))

    # ------------------------------------------------------------------ delivery

    async def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._deliver_loop(), name="alerts")

    async def aclose(self) -> None:
        """Stop delivering (what is still queued or waiting for a retry is dropped)."""
        tasks = [t for t in (self._worker, *self._retries) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._worker = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _deliver_loop(self) -> None:
        while True:
            item = await self._queue.get()
            self._busy = True
            try:
                await self._deliver(item, self._targets())
            except Exception:  # a bug here must not end alerting
                log.exception("alerts: delivering %r failed", item.text)
            finally:
                self._busy = False
            self._check_idle()

    def _check_idle(self) -> None:
        if self._queue.empty() and not self._retries and not self._busy:
            self.idle.set()

    def _targets(self) -> list[str]:
        cfg = self.config
        if cfg is None:
            return []
        return [t for t, on in (("webhook", cfg.webhook_env), ("command", cfg.command)) if on]

    async def _deliver(self, item: Delivery, targets: list[str]) -> None:
        for target in targets:
            try:
                if target == "webhook":
                    await self._post(item)
                else:
                    await self._run(item)
            except _Permanent as exc:
                self.failed += 1
                log.error("alerts: %s not sent (%s): %s", target, exc, item.text)
                continue
            except Exception as exc:
                self.failed += 1
                self._retry(item, target, f"{type(exc).__name__}: {exc}")
                continue
            self.delivered += 1

    def _retry(self, item: Delivery, target: str, why: str) -> None:
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
            await self._deliver(item, [target])

        task = asyncio.create_task(later(), name=f"alert retry {target}")
        self._retries.add(task)

        def done(t: asyncio.Task) -> None:
            self._retries.discard(t)
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

    async def _run(self, item: Delivery) -> None:
        cfg = self.config
        assert cfg is not None and cfg.command
        extra = {
            f"VSUP_ALERT_{k.upper()}": "" if v is None else str(v)
            for k, v in item.payload.items()
            if k != "text"
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *cfg.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **extra, "VSUP_ALERT_TEXT": item.text},
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


class _Permanent(Exception):
    """A delivery that a retry cannot fix (no URL configured, no such program)."""


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 1
