"""Checking a layout the dashboard is about to apply: the same compile as `vsup up`.

Two checks, both off the event loop: the layout compiled here (`vsup.layout.compiled`, in a
thread: it reads profiles and model files), then the daemon's dry run (`apply(dry_run=True)`),
which compiles it again on the daemon's side and says what would start, restart and stop. A
layout with an error is never applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vsup.answers import ApplyPlan, Problem, decode
from vsup.layout.compiled import compile_document
from vsup.layout.diagnostics import Diagnostic
from vsup.layout.model import dumps_layout
from vsup.layout.node import NodeFacts
from vsup.layout.validate import instance_diagnostics
from vsup.tui import layout_edit
from vsup.tui.client import DashboardClient, answer_errors


@dataclass
class Verdict:
    toml: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    plan: ApplyPlan = field(default_factory=ApplyPlan)

    @property
    def ok(self) -> bool:
        return not self.errors


def error_messages(exc: BaseException) -> list[str]:
    """Messages from a refused call: the diagnostics of its body when it has them (a refused
    save's `errors`), else its text."""
    body: Any = getattr(exc, "body", None)
    errors = body.get("errors") if isinstance(body, dict) else None
    if errors and isinstance(errors, list):
        return [str(p) for p in decode(tuple[Problem, ...], errors, "the refusal's 'errors'")]
    return [str(exc) or type(exc).__name__]


def _node(node_gpus: int | None) -> NodeFacts | None:
    """The node the daemon reports (its GPU count), as validation takes it."""
    return NodeFacts.given(node_gpus) if node_gpus is not None else None


def _split(diagnostics: list[Diagnostic]) -> tuple[list[str], list[str]]:
    return (
        [d.format() for d in diagnostics if d.is_error],
        [d.format() for d in diagnostics if not d.is_error],
    )


def instance_rules(
    toml_text: str,
    path: str | None,
    table: Mapping[str, Any],
    replace: str | None,
    node_gpus: int | None,
) -> Verdict:
    """The layout with `table` added (or replacing `replace`) and what validation says about
    that instance. Blocking (reads files): run it in a thread."""
    layout = layout_edit.parse(toml_text, path)
    name = table.get("name")
    # a table without a string name is validate_instance's to report, not a duplicate
    if isinstance(name, str) and name != replace and layout.instance(name) is not None:
        return Verdict(
            toml_text,
            errors=[
                f"{path or 'layout'}: instance '{name}': key 'name': another instance already has "
                "this name; choose another name"
            ],
        )
    if replace is not None and layout.instance(replace) is None:
        raise KeyError(replace)
    candidate = layout.with_instance(table, replace)
    _compiled, diagnostics = compile_document(candidate, _node(node_gpus))
    mine = instance_diagnostics(diagnostics, layout, table, replace)
    errors, warnings = _split(mine)
    return Verdict(dumps_layout(candidate), errors, warnings)


def layout_rules(toml_text: str, path: str | None, node_gpus: int | None) -> Verdict:
    """What compiling a whole layout text says. Blocking: run it in a thread."""
    _compiled, diagnostics = compile_document(layout_edit.parse(toml_text, path), _node(node_gpus))
    errors, warnings = _split(diagnostics)
    return Verdict(toml_text, errors, warnings)


async def dry_run(client: DashboardClient, verdict: Verdict, path: str | None) -> Verdict:
    """Ask the daemon what applying `verdict.toml` would do; its refusals become errors."""
    if verdict.errors:
        return verdict
    try:
        answer = await client.apply(verdict.toml, path, dry_run=True)
    except Exception as exc:  # a refusal (4xx) carries the daemon's validation errors
        verdict.errors += error_messages(exc)
        return verdict
    verdict.errors += answer_errors(answer)
    seen = set(verdict.warnings)
    verdict.warnings += [str(w) for w in answer.warnings if str(w) not in seen]
    verdict.plan = answer.plan or ApplyPlan()
    return verdict


async def check_instance(
    client: DashboardClient,
    toml_text: str,
    path: str | None,
    table: Mapping[str, Any],
    replace: str | None,
    node_gpus: int | None,
    local: bool = True,
) -> Verdict:
    """A form's instance: local rules in a thread, then the daemon's dry run."""
    if local:
        verdict = await asyncio.to_thread(
            instance_rules, toml_text, path, table, replace, node_gpus
        )
    else:
        verdict = Verdict(layout_edit.with_instance(toml_text, table, replace, path))
    return await dry_run(client, verdict, path)


async def check_layout(
    client: DashboardClient,
    toml_text: str,
    path: str | None,
    node_gpus: int | None,
    local: bool = True,
) -> Verdict:
    """A whole layout (after a removal): local rules in a thread, then the daemon's dry run."""
    if local:
        verdict = await asyncio.to_thread(layout_rules, toml_text, path, node_gpus)
    else:
        verdict = Verdict(toml_text)
    return await dry_run(client, verdict, path)


def plan_text(plan: ApplyPlan) -> str:
    """`start: a, b · restart: c · stop: d` (unchanged instances are not mentioned)."""
    parts = [
        f"{what}: {', '.join(names)}"
        for what, names in (("start", plan.start), ("restart", plan.restart), ("stop", plan.stop))
        if names
    ]
    return " · ".join(parts) if parts else "nothing to start, restart or stop"
