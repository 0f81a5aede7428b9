"""Checking a layout the dashboard is about to apply: the same rules as `vsup validate`.

Two checks, both off the event loop: the layout package's validation (in a thread: it reads
profiles and model paths), then the daemon's dry run (`apply(dry_run=True)`), which validates
again against this node and says what would start, restart and stop. A layout with an error
is never applied or saved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from supervisor.tui.client import DashboardClient, answer_errors

# (toml_text, path, node_gpus) -> (errors, warnings), each message naming file, instance, key
Validator = Callable[[str, str, "int | None"], tuple[list[str], list[str]]]


@dataclass
class Verdict:
    toml: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    plan: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def error_messages(exc: BaseException) -> list[str]:
    """Messages from a refused call: the answer's `errors` when it has them, else its text."""
    body: Any = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("errors"):
        return answer_errors(body)
    return [str(exc) or type(exc).__name__]


def default_validator() -> Validator | None:
    """The layout package's validation, when this checkout has it."""
    try:
        from supervisor.layout import validate as _validate  # noqa: F401
    except ModuleNotFoundError:
        return None
    return _layout_validator


def _layout_validator(toml_text: str, path: str, node_gpus: int | None) -> tuple[list[str], list[str]]:
    from supervisor.layout.validate import validate_text

    diagnostics = validate_text(toml_text, path=path, node_gpus=node_gpus)
    errors = [d.format() for d in diagnostics if d.is_error]
    warnings = [d.format() for d in diagnostics if not d.is_error]
    return errors, warnings


async def check_layout(
    client: DashboardClient,
    toml_text: str,
    path: str,
    validator: Validator | None,
    node_gpus: int | None,
) -> Verdict:
    """Validate `toml_text` locally, then ask the daemon for a dry run; never applies."""
    verdict = Verdict(toml_text)
    if validator is not None:
        errors, warnings = await asyncio.to_thread(validator, toml_text, path, node_gpus)
        verdict.errors += errors
        verdict.warnings += warnings
    if verdict.errors:
        return verdict
    try:
        answer = await client.apply(toml_text, path, dry_run=True)
    except Exception as exc:  # a refusal (4xx) carries the daemon's validation errors
        verdict.errors += error_messages(exc)
        return verdict
    verdict.errors += answer_errors(answer)
    verdict.warnings += [w for w in map(str, answer.get("warnings") or ())
                         if w not in verdict.warnings]
    verdict.plan = dict(answer.get("plan") or {})
    return verdict


def plan_text(plan: dict[str, list[str]]) -> str:
    """`start: a, b · restart: c · stop: d` (unchanged instances are not mentioned)."""
    parts = [f"{what}: {', '.join(plan[what])}" for what in ("start", "restart", "stop")
             if plan.get(what)]
    return " · ".join(parts) if parts else "nothing to start, restart or stop"
