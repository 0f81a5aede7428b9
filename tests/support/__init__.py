"""Test support shared by tests and benchmarks: a clock that moves on command (`clock`),
plausible status snapshots (`samples`) and the in-memory control client that injects them
into the dashboard (`memory`). Imported from the checkout, never shipped in vsup's wheel."""
