"""Telemetry: what vsup reads from vLLM servers, their logs and the GPUs. Never imports Textual.

| module | one job |
|---|---|
| `metrics` | `parse_metrics(text) -> VllmMetrics`: the families vsup shows, any vLLM version |
| `promtext` | the Prometheus sample-line parser `metrics` uses (prometheus_client-equivalent) |
| `rates` | `InstanceRates` (counters -> tokens/s, preemptions/min), `History` (sparklines) |
| `scrape` | `Scraper`: one keep-alive HTTP client, concurrent `/metrics` and `/health` |
| `backend` | the attention backend from log lines, else the flag, else the platform default |
| `logwatch` | `LogWatcher`: follows a growing log (tail, backend, readiness lines) |
| `gpu` | `open_probe()` -> NVML / amdsmi / none probe: `snapshot() -> tuple[GpuSample, ...]` |
| `hbm` | `attribute()`: per-instance HBM, pid owners, foreign pids; `gpu_statuses()` |
| `view` | `telemetry_fields()`: the above -> `InstanceStatus` keys |
| `instance` | `InstanceTelemetry`: one instance's scrapes, rates, history, log, backend |
"""
