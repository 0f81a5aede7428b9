"""Benchmarks: each module runs as `python -m benchmarks.NAME` and prints its figures, the
decisive ones on its last line as `key=value` pairs."""
