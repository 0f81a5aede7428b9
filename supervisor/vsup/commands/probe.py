"""`vsup probe`: what vsup reads from one vLLM server, managed by vsup or not.

    vsup probe URL [--log-file L] [--attention-backend X] [--once] [--json]
    vsup probe --metrics-file F [--log-file L] [--attention-backend X] [--json]

The output uses the status JSON's instance keys (docs/ARCHITECTURE.md). From a URL, `/metrics` is
scraped twice, `--interval` (1 s) apart, so that tokens/s and preemptions/min are real rates
over that second; `--once` scrapes once and leaves the rates null. A metrics file is one
payload: its rates are null. The attention backend comes from the log file when given (else
`--attention-backend`, else the platform default when the log names the platform).

Exit status: 0 when vLLM metrics were read; 1 when the server cannot be reached or the payload
holds no vLLM metrics (the nulls are still printed); 2 for bad usage or an unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "probe",
        help="read one vLLM server's metrics, backend and state (managed or not)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("url", nargs="?", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--metrics-file", type=Path, help="a saved /metrics payload instead of a URL")
    p.add_argument("--log-file", type=Path, help="the server's log, for the attention backend")
    p.add_argument("--attention-backend", help="the server's --attention-backend, if set")
    p.add_argument("--json", action="store_true", help="print the instance as JSON")
    p.add_argument("--once", action="store_true", help="scrape once (rates stay null)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between the two scrapes")
    p.add_argument("--timeout", type=float, default=5.0, help="per-request timeout in seconds")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.url) == bool(args.metrics_file):
        print("vsup probe: give a URL or --metrics-file FILE (one of them)", file=sys.stderr)
        return 2
    if args.interval <= 0 or args.timeout <= 0:
        print("vsup probe: --interval and --timeout must be positive", file=sys.stderr)
        return 2

    from vsup.telemetry.logwatch import LogWatcher, scan_log

    watcher: LogWatcher | None = None
    if args.log_file is not None:
        if not args.log_file.is_file():
            print(
                f"vsup probe: cannot read the log file {args.log_file}: no such file",
                file=sys.stderr,
            )
            return 2
        try:
            watcher = scan_log(args.log_file)
        except OSError as exc:
            print(f"vsup probe: cannot read the log file {args.log_file}: {exc}", file=sys.stderr)
            return 2

    if args.metrics_file is not None:
        doc, code = _from_file(args, watcher)
    else:
        import asyncio

        doc, code = asyncio.run(_from_url(args, watcher))
    if doc is None:
        return code
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_human(doc)
    return code


def _backend(args: argparse.Namespace, watcher: Any) -> Any:
    from vsup.telemetry.backend import resolve_backend

    if watcher is not None:
        return watcher.backend_info(flag=args.attention_backend)
    return resolve_backend(None, args.attention_backend, None)


def _memory(watcher: Any) -> dict[str, Any]:
    """vLLM's own memory account from the log (`vllm_*` keys), when the log has it."""
    profile = watcher.memory.profile() if watcher is not None else None
    return profile.fields() if profile is not None else {}


def _instance(
    name: str, state: str | None, metrics: Any, rates: Any, backend: Any, **known: Any
) -> dict[str, Any]:
    from vsup.snapshot import empty_instance
    from vsup.telemetry.view import telemetry_fields

    inst = empty_instance(name, **telemetry_fields(metrics, rates, backend), **known)
    doc = inst.to_json()
    doc["state"] = state
    doc["restarts"] = None  # not supervised: vsup does not know
    return doc


def _from_file(args: argparse.Namespace, watcher: Any) -> tuple[dict[str, Any] | None, int]:
    from vsup.telemetry.metrics import parse_metrics

    path: Path = args.metrics_file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        print(
            f"vsup probe: cannot read the metrics file {path}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return None, 2
    metrics = parse_metrics(raw.decode("utf-8", errors="replace"))
    code = 0
    if not metrics.found:
        print(
            f"vsup probe: {path} holds no vLLM metrics (expected Prometheus text with vllm:* "
            "samples, as GET /metrics returns); every value is null",
            file=sys.stderr,
        )
        code = 1
    model = metrics.model_names[0] if metrics.model_names else None
    doc = _instance(
        path.stem, None, metrics, None, _backend(args, watcher), model=model, **_memory(watcher)
    )
    return doc, code


async def _from_url(args: argparse.Namespace, watcher: Any) -> tuple[dict[str, Any] | None, int]:
    import time
    from urllib.parse import urlsplit

    base = _base_url(args.url)
    parts = urlsplit(base)
    if not parts.hostname:
        print(f"vsup probe: {args.url!r} is not a URL (expected http://HOST:PORT)", file=sys.stderr)
        return None, 2
    scraped = await _scrape(args, base)
    if scraped is None:
        return None, 1
    health, result, current = scraped
    metrics = result.metrics
    code = 0
    if not result.ok:
        print(f"vsup probe: {result.error}", file=sys.stderr)
        code = 1
    state = "ready" if health.ok else ("unhealthy" if health.status is not None else None)
    uptime = None
    if metrics.process_start_time_s is not None:
        uptime = max(0.0, time.time() - metrics.process_start_time_s)
    model = metrics.model_names[0] if metrics.model_names else None
    doc = _instance(
        f"{parts.hostname}:{parts.port or 80}",
        state,
        metrics,
        current,
        _backend(args, watcher),
        port=parts.port,
        host=parts.hostname,
        model=model,
        uptime_s=uptime,
        **_memory(watcher),
    )
    return doc, code


async def _scrape(args: argparse.Namespace, base: str) -> tuple[Any, Any, Any] | None:
    """(health, the last good scrape, its rates): two scrapes --interval apart (one with
    --once, or when the first failed); None when neither answered (said on stderr)."""
    import asyncio

    from vsup.clock import SystemClock
    from vsup.telemetry.rates import InstanceRates
    from vsup.telemetry.scrape import Scraper

    async with Scraper(timeout_s=args.timeout) as scraper:
        health, first = await asyncio.gather(scraper.health(base), scraper.scrape(base))
        if first.status is None and health.status is None:
            print(f"vsup probe: cannot reach {base}: {first.error}", file=sys.stderr)
            return None
        clock = SystemClock()
        rates = InstanceRates(clock)
        result = first
        current = rates.observe(first.metrics) if first.ok else None
        if first.ok and not args.once:
            await asyncio.sleep(args.interval)
            second = await scraper.scrape(base)
            if second.ok:
                result = second
                current = rates.observe(second.metrics)
    return health, result, current


def _base_url(url: str) -> str:
    """`127.0.0.1:8000`, `http://h:8000/`, `http://h:8000/metrics` -> `http://h:8000`."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    for suffix in ("/metrics", "/health"):
        if url.rstrip("/").endswith(suffix):
            url = url.rstrip("/")[: -len(suffix)]
    return url.rstrip("/")


def _print_human(doc: dict[str, Any]) -> None:
    def show(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value) or "-"
        return str(value)

    width = max(len(k) for k in doc)
    for key, value in doc.items():
        print(f"{key:<{width}}  {show(value)}")
