"""vsup starts vllm-router retrying densely (every 4 ms for about as long as its default
backoff), so that a request finds a member put back after another user removed it; a layout
that sets a retry flag of its own gets none of vsup's (layout/routerspec.py)."""

from __future__ import annotations

from tests.unit.router.test_spec import LAYOUT, spec_of


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_router_retries_every_4_ms_by_default():
    argv = spec_of(LAYOUT.replace("retry_max_retries = 2, ", "")).argv()
    assert flag(argv, "--retry-max-retries") == "100"
    assert flag(argv, "--retry-initial-backoff-ms") == "4"
    assert flag(argv, "--retry-max-backoff-ms") == "4"
    assert flag(argv, "--retry-backoff-multiplier") == "1.0"


def test_a_retry_flag_in_args_takes_over_all_of_them():
    argv = spec_of(LAYOUT).argv()  # retry_max_retries = 2
    assert flag(argv, "--retry-max-retries") == "2"
    assert "--retry-initial-backoff-ms" not in argv and argv.count("--retry-max-retries") == 1
    argv = spec_of(LAYOUT.replace("retry_max_retries = 2", "disable-retries = true")).argv()
    assert "--disable-retries" in argv and "--retry-max-retries" not in argv
