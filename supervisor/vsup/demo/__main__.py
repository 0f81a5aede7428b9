"""`make demo`: two real CPU vLLM servers of a generated tiny model, under vsup, in the dashboard.

1. generate the tiny model where layouts/cpu-demo.toml expects it;
2. `vsup up layouts/cpu-demo.toml --detach` (starts the daemon, which starts the instances);
3. a bounded loopback load in the background so KV %, throughput and preemptions move;
4. the dashboard in the foreground. `q` detaches: the instances keep running (that is the
   point of vsup); `make demo-down` stops them and the daemon.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from vsup.demo.tinymodel import generate

# `make demo` passes the checkout's layout; run by hand from a checkout, this finds it too.
DEFAULT_LAYOUT = Path("layouts") / "cpu-demo.toml"


def _demo_targets(layout_path: Path) -> tuple[list[Path], list[int]]:
    """The local model directories and the ports the demo layout uses."""
    from vsup.layout.model import load_layout

    layout = load_layout(layout_path)
    specs = layout.resolve()
    models = sorted({Path(s.model) for s in specs if s.model.startswith("/")})
    return models, [s.port for s in specs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", type=Path, default=DEFAULT_LAYOUT)
    p.add_argument("--no-load", action="store_true", help="don't start the loopback load")
    p.add_argument("--no-tui", action="store_true", help="start everything, don't attach")
    args = p.parse_args(argv)
    if not args.layout.is_file():
        p.error(
            f"no demo layout at {args.layout}: run `make demo` from the checkout, or pass "
            "--layout with the path of layouts/cpu-demo.toml"
        )

    models, ports = _demo_targets(args.layout)
    for model in models:
        print(f"demo: tiny model at {generate(model)}")
    vsup = [sys.executable, "-m", "vsup"]
    rc = subprocess.call([*vsup, "up", str(args.layout), "--detach"])
    if rc != 0:
        return rc
    load = None
    if not args.no_load:
        home = home_of_demo()
        log = open(home / "demo-load.log", "ab")
        load = subprocess.Popen(
            [sys.executable, "-m", "vsup.demo.load", *map(str, ports), "--vsup-home", str(home)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        print(f"demo: loopback load on ports {ports} (pid {load.pid}, log {log.name})")
    try:
        if args.no_tui:
            return 0
        return subprocess.call([*vsup, "tui"])
    finally:
        if load is not None and not args.no_tui:
            os.killpg(load.pid, signal.SIGTERM)
            load.wait(timeout=10)
        print(detach_message(home_of_demo()))


def home_of_demo() -> Path:
    """The VSUP_HOME the demo's daemon serves, absolute (as `vsup` resolves it)."""
    from vsup import paths

    return paths.vsup_home()


def detach_message(home: Path) -> str:
    """What re-attaches: a plain `vsup` uses the default VSUP_HOME, not the demo's, and would
    find no daemon there."""
    from vsup.paths import vsup_program

    vsup = vsup_program()
    return (
        f"demo: the instances keep running under the vsup daemon of VSUP_HOME={home}.\n"
        f"  attach again:  make demo-attach   (in the checkout)\n"
        f"            or:  VSUP_HOME={home} {vsup}\n"
        f"  stop them:     make demo-down     (or VSUP_HOME={home} {vsup} down)"
    )


if __name__ == "__main__":
    sys.exit(main())
