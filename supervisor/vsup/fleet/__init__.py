"""The fleet: many nodes from one terminal over the operator's OpenSSH (docs/fleet.md).

`model` (the fleet file), `transport` (ControlMaster + the daemon socket forwarded), `query`
(every node in parallel, each under its deadline), `view` (a node's summary), `rollout`
(`vsup fleet up`), `events` (journals merged), `targets` (Prometheus service discovery).
Never imports Textual.
"""
