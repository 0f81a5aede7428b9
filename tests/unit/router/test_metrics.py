"""The router's /metrics text (as vllm-router 0.1.17 writes it) into RouterMetrics."""

from __future__ import annotations

from vsup.router import parse_router_metrics

# Shape copied from a real vllm-router 0.1.17 scrape (blank lines between families included).
TEXT = """\
# TYPE vllm_router_processed_requests_total counter
vllm_router_processed_requests_total{worker="http://127.0.0.1:18101"} 6

vllm_router_processed_requests_total{worker="http://127.0.0.1:18102"} 2

# TYPE vllm_router_requests_total counter
vllm_router_requests_total{route="/v1/completions"} 7
vllm_router_requests_total{route="/v1/models"} 1

# TYPE vllm_router_request_errors_total counter
vllm_router_request_errors_total{route="/v1/completions",error_type="upstream"} 2

vllm_router_worker_health{worker="http://127.0.0.1:18101"} 1
vllm_router_worker_health{worker="http://127.0.0.1:18102"} 0

vllm_router_active_workers 2
vllm_router_generate_duration_seconds_sum 0.72
"""


def test_router_figures_are_summed_and_split_per_worker():
    m = parse_router_metrics(TEXT)
    assert m.requests_total == 8
    assert m.errors_total == 2
    assert m.active_workers == 2
    assert m.retries_total is None
    assert m.worker_requests == {"http://127.0.0.1:18101": 6, "http://127.0.0.1:18102": 2}
    assert m.worker_health == {"http://127.0.0.1:18101": 1, "http://127.0.0.1:18102": 0}
    assert m.worker_share() == {"http://127.0.0.1:18101": 0.75, "http://127.0.0.1:18102": 0.25}


def test_nothing_known_is_none_not_zero():
    m = parse_router_metrics("")
    assert m.requests_total is None and m.worker_share() == {}
