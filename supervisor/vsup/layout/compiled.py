"""The compiled layout: a layout's TOML read once, checked on a node, and turned into every
value its consumers need.

```python
compiled, diagnostics = compile_layout(text, path, node)   # None when any diagnostic is an error
compiled.specs            # tuple[InstanceSpec, ...], file order
compiled.router           # RouterSpec | None              ([router])
compiled.alerts           # AlertConfig | None             ([alerts])
compiled.metrics_listen   # (host, port) | None            ([layout] metrics_listen)
compiled.rollout          # RolloutSettings    ([layout] max_unavailable, drain_timeout_s, canary*)
compiled.name, .path, .text, .layout (the Layout document: save, edits), .source_map, .warnings
```
The layout-level values (alerts, metrics listener, rollout) are one `LayoutSettings`; a daemon
whose running layout no longer compiles (restore after an upgrade or a lost GPU) still reads
them with `layout_settings`.
The daemon's apply, its dry run and its restore, `vsup up`, `vsup validate`, `vsup plan`,
`vsup bench` and the dashboard's forms all take a layout through here, so each reads the TOML
once and no consumer reads a raw table. A new layout-level table is added in one place: its
keys in `schema.py` (checked by `structure.py`), its typed value built in `compile_document`,
a field on `LayoutSettings` (or, when it needs the instances like `[router]`, on
`CompiledLayout`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.alertconfig import AlertConfig
from vsup.layout.cpubind import bind_cpu_instances
from vsup.layout.diagnostics import ERROR, Diagnostic
from vsup.layout.merge import MergedInstance, merge_instances, profile_cache_for
from vsup.layout.model import Layout, dumps_layout, load_layout, loads_layout
from vsup.layout.node import NodeFacts
from vsup.layout.resolve import spec_from_merged
from vsup.layout.routerspec import RouterSpec, router_spec
from vsup.layout.sourcemap import SourceMap
from vsup.layout.span import DeclaredSpan, SpanUnit, read_span
from vsup.layout.spec import CanarySettings, InstanceSpec
from vsup.layout.validate import check

__all__ = [
    "CompiledLayout",
    "LayoutSettings",
    "RolloutSettings",
    "compile_document",
    "compile_file",
    "compile_layout",
    "declared_spans",
    "layout_settings",
    "span_without_node",
    "span_units",
]


@dataclass(frozen=True)
class RolloutSettings:
    """How a rolling apply of this layout goes (`[layout]`; docs/layout.md)."""

    max_unavailable: int = 1  # serving instances taken down at a time
    drain_timeout_s: float | None = None  # None: each instance's own drain_timeout_s
    canary: CanarySettings = field(default_factory=CanarySettings)  # watch_s 0: none


@dataclass(frozen=True)
class LayoutSettings:
    """What a layout sets for the whole node besides its instances and router."""

    alerts: AlertConfig | None = None  # [alerts]; None: no alert is sent
    metrics_listen: tuple[str, int] | None = None  # [layout] metrics_listen; None: no exporter
    rollout: RolloutSettings = field(default_factory=RolloutSettings)


def layout_settings(layout: Layout) -> LayoutSettings:
    """The `LayoutSettings` of a document. Meant for one that validated; of another it raises
    ValueError or TypeError where a value has the wrong type."""
    header = layout.header
    drain = header.get("drain_timeout_s")
    return LayoutSettings(
        alerts=AlertConfig.from_table(layout.alerts),
        metrics_listen=layout.metrics_listen,
        rollout=RolloutSettings(
            max_unavailable=int(header.get("max_unavailable", 1)),
            drain_timeout_s=float(drain) if drain is not None else None,
            canary=canary_settings(header),
        ),
    )


def canary_settings(header: Mapping[str, Any]) -> CanarySettings:
    """`[layout] canary_s`, `canary` and the `canary_*` thresholds (schema.CANARY_KEYS)."""
    d = CanarySettings()
    max_s = header.get("canary_max_s")
    warmup = header.get("canary_warmup_s")
    return CanarySettings(
        watch_s=float(header.get("canary_s", d.watch_s)),
        instances=int(header.get("canary", d.instances)),
        min_requests=int(header.get("canary_min_requests", d.min_requests)),
        insufficient=str(header.get("canary_insufficient", d.insufficient)),
        max_s=float(max_s) if max_s is not None else None,
        failed_pct=float(header.get("canary_failed_pct", d.failed_pct)),
        min_failed=int(header.get("canary_min_failed", d.min_failed)),
        p50_ratio=float(header.get("canary_p50_ratio", d.p50_ratio)),
        p99_ratio=float(header.get("canary_p99_ratio", d.p99_ratio)),
        min_delta_ms=float(header.get("canary_min_delta_ms", d.min_delta_ms)),
        preemption_ratio=float(header.get("canary_preemption_ratio", d.preemption_ratio)),
        min_preemptions_per_min=float(
            header.get("canary_min_preemptions_per_min", d.min_preemptions_per_min)
        ),
        warmup_s=float(warmup) if warmup is not None else None,
        confidence=float(header.get("canary_confidence", d.confidence)),
    )


@dataclass(frozen=True, eq=False)
class CompiledLayout:
    """A layout that validated on a node, with every value derived from it. Immutable: an edit
    makes a new Layout (`layout.with_instance(...)`) and compiles that."""

    layout: Layout  # the document as written (unknown keys and order kept): save and edits
    text: str  # the TOML text it was read from (an edited document: as it would be written)
    path: str | None  # the file it names (relative models resolve against it); None: none
    specs: tuple[InstanceSpec, ...]
    router: RouterSpec | None
    settings: LayoutSettings
    warnings: tuple[Diagnostic, ...] = field(default=())

    @property
    def alerts(self) -> AlertConfig | None:
        """`[alerts]` typed; None when the layout sends none."""
        return self.settings.alerts

    @property
    def metrics_listen(self) -> tuple[str, int] | None:
        """(host, port) of the Prometheus exporter, or None when the layout has none."""
        return self.settings.metrics_listen

    @property
    def rollout(self) -> RolloutSettings:
        return self.settings.rollout

    @property
    def name(self) -> str:
        """`[layout] name`, else the file's stem, else "layout"."""
        return self.layout.name

    @property
    def names(self) -> tuple[str, ...]:
        """The instance names, in file order."""
        return tuple(s.name for s in self.specs)

    @property
    def source_map(self) -> SourceMap:
        """Where each table and key is written in `text` (file lines for diagnostics)."""
        return self.layout.source_map

    def line(self, *path: str | int) -> int | None:
        """The line of a document path, e.g. `line("instance", 2, "port")`."""
        return self.layout.line(*path)

    def spec(self, name: str) -> InstanceSpec | None:
        """The spec of the instance `name`, or None."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        return None


def span_without_node(layout: Layout, index: int, name: str) -> Diagnostic:
    """A span is every node's part of one server: which part runs here depends on which node
    this is, and a layout applied without `[layout] node` does not say."""
    return Diagnostic(
        ERROR,
        "spans nodes: which part of it runs here depends on the node, and the layout does not "
        "name it; apply it with `vsup fleet up` (it tells each node its name) or set "
        '[layout] node = "NAME" (the fleet file\'s name of this node; docs/fleet.md, "One '
        'server across nodes")',
        file=layout.file,
        line=layout.line("instance", index, "span"),
        instance=name,
        key="span",
    )


def _member_specs(
    layout: Layout, merged: Sequence[MergedInstance]
) -> tuple[list[InstanceSpec], list[Diagnostic]]:
    """Each instance's spec on this node: a span's is this node's part (`SpanUnit.member`,
    `[layout] node`), and a span this node has no part in runs nothing here."""
    node = layout.header.get("node")
    specs: list[InstanceSpec] = []
    errors: list[Diagnostic] = []
    for m in merged:
        spec = spec_from_merged(m, layout)
        span = read_span(m.values.get("span"))
        if span is None:
            specs.append(spec)
        elif not isinstance(node, str):
            errors.append(span_without_node(layout, m.index, m.label))
        elif node in span.nodes:
            specs.append(SpanUnit(spec, span, m.index).member(node).spec)
    return specs, errors


def span_units(
    layout: Layout, node: NodeFacts | None = None, profile_dirs: Sequence[Path] | None = None
) -> tuple[list[SpanUnit], list[Diagnostic]]:
    """The layout's instances that span nodes (each with every node's part: `unit.members()`)
    and the layout's diagnostics (errors first); no unit when any is an error."""
    checked = check(layout, node, profile_dirs)
    if not checked.ok:
        return [], checked.diagnostics
    units = []
    for m in checked.merged:
        span = read_span(m.values.get("span"))
        if span is not None:
            units.append(SpanUnit(spec_from_merged(m, layout), span, m.index))
    return units, checked.diagnostics


def declared_spans(
    layout: Layout, profile_dirs: Sequence[Path] | None = None
) -> list[DeclaredSpan]:
    """Every instance's usable `span`, even in a layout with errors elsewhere (so that a node
    the fleet lacks is said with the rest); none of a layout that is not TOML."""
    if layout.load_errors:
        return []
    out = []
    for m in merge_instances(layout, profile_cache_for(layout, profile_dirs)):
        span = read_span(m.values.get("span"))
        if span is not None:
            out.append(DeclaredSpan(m.index, m.label, span))
    return out


def compile_layout(
    text: str,
    path: Path | str | None = None,
    node: NodeFacts | None = None,
    profile_dirs: Sequence[Path] | None = None,
) -> tuple[CompiledLayout | None, list[Diagnostic]]:
    """Read, check and compile a layout text: (the compiled layout, or None when anything is an
    error; every diagnostic, errors first). Never raises for bad input.

    `path`: the file the text names (diagnostics say it; relative models resolve against it).
    `node`: the node to check against (`vsup.telemetry.gpu.node_facts()`, or
    `NodeFacts.given(n)`); None: the node is unknown (GPU indices only checked to be >= 0).
    """
    return compile_document(loads_layout(text, path), node, profile_dirs)


def compile_file(
    path: Path | str,
    node: NodeFacts | None = None,
    profile_dirs: Sequence[Path] | None = None,
) -> tuple[CompiledLayout | None, list[Diagnostic]]:
    """`compile_layout` of a file, read by `files.read_text` (regular, UTF-8, at most 1 MiB;
    anything else is a diagnostic)."""
    return compile_document(load_layout(path), node, profile_dirs)


def compile_document(
    layout: Layout,
    node: NodeFacts | None = None,
    profile_dirs: Sequence[Path] | None = None,
) -> tuple[CompiledLayout | None, list[Diagnostic]]:
    """`compile_layout` of a document already read (`load_layout`, or a form's edit)."""
    checked = check(layout, node, profile_dirs)
    if not checked.ok:
        return None, checked.diagnostics
    members, refused = _member_specs(layout, checked.merged)
    if refused:
        return None, refused + checked.diagnostics
    # CPU instances get cores of their own (cpubind.py), as `Layout.resolve()` gives them
    specs = tuple(bind_cpu_instances(members))
    compiled = CompiledLayout(
        layout=layout,
        text=layout.source if layout.source is not None else dumps_layout(layout),
        path=layout.file,
        specs=specs,
        router=router_spec(layout, specs),
        settings=layout_settings(layout),
        warnings=tuple(checked.diagnostics),
    )
    return compiled, checked.diagnostics
