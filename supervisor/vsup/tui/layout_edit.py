"""Layout edits the dashboard's instance form makes: TOML text in, TOML text out.

The form edits an `[[instance]]` table as written (not the resolved spec), so keys it leaves
blank keep inheriting from `[defaults]` and profiles, and keys it does not show (restart,
command, env overrides...) are kept. Field values are checked for type here; whether the
layout is valid is decided by the layout's own validation (`validation.py`). The text is
read and written by the layout model (`vsup.layout.model`), in its canonical form.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any

import tomli_w

from vsup.layout.model import Layout, dumps_layout, loads_layout

# The form's fields, in order: (key, label, placeholder).
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("name", "name", "gpu0a"),
    ("model", "model", "blank: [defaults] model"),
    ("gpus", "GPUs", "0 or 0,1; blank: CPU"),
    ("port", "port", "8000"),
    ("gpu_memory_utilization", "GPU memory util.", "0.45; blank: inherited"),
    ("args", "vLLM args", "max-model-len = 8192, enforce-eager = true"),
    ("env", "env", 'VLLM_ROCM_USE_AITER = "1"'),
)
FORM_KEYS = tuple(key for key, _, _ in FIELDS)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class FieldError(ValueError):
    """A form value of the wrong type: names the field and says what to write."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def parse(toml_text: str, path: str | None = None) -> Layout:
    """The running layout's text as a Layout; a text that does not parse is an error here
    (the daemon only runs layouts that do)."""
    layout = loads_layout(toml_text, path)
    if layout.load_errors:
        raise ValueError("; ".join(d.format() for d in layout.load_errors))
    return layout


def instance_table(toml_text: str, name: str, path: str | None = None) -> dict[str, Any]:
    """The `[[instance]]` table named `name`, as written in the layout."""
    table = parse(toml_text, path).instance(name)
    if table is None:
        raise KeyError(name)
    return dict(table)


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_inline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _key(key: str) -> str:
    return (
        key
        if re.fullmatch(r"[A-Za-z0-9_-]+", key)
        else tomli_w.dumps({key: 0}).split("=", 1)[0].strip()
    )


def inline_body(table: Mapping[str, Any]) -> str:
    """`a = 1, b = "x"`: a table as the inside of a TOML inline table (the form's text)."""
    return ", ".join(f"{_key(k)} = {_inline(v)}" for k, v in table.items())


def form_values(table: Mapping[str, Any]) -> dict[str, str]:
    """Text for each form field from an instance table (blank where the key is not set)."""
    gmu = table.get("gpu_memory_utilization")
    return {
        "name": str(table.get("name", "")),
        "model": str(table.get("model", "")),
        "gpus": ",".join(str(g) for g in table.get("gpus", [])),
        "port": str(table.get("port", "")),
        "gpu_memory_utilization": "" if gmu is None else repr(gmu),
        "args": inline_body(table.get("args", {})),
        "env": inline_body(table.get("env", {})),
    }


def _parse_inline(field: str, text: str) -> dict[str, Any]:
    try:
        return dict(tomllib.loads(f"v = {{ {text} }}")["v"]) if text.strip() else {}
    except tomllib.TOMLDecodeError as exc:
        raise FieldError(
            field,
            f"not a TOML inline table body ({exc}); write e.g. "
            f"max-model-len = 8192, enforce-eager = true",
        ) from None


def parse_form(values: Mapping[str, str]) -> dict[str, Any]:
    """The form's values as instance-table keys; a blank optional field is absent (inherit).

    Raises `FieldError` naming the first field that is not of its type.
    """
    table: dict[str, Any] = {"name": _parse_name(values.get("name", "").strip())}
    model = values.get("model", "").strip()
    if model:
        table["model"] = model
    table["gpus"] = _parse_gpus(values.get("gpus", "").strip())
    table["port"] = _parse_port(values.get("port", "").strip())
    gmu_text = values.get("gpu_memory_utilization", "").strip()
    if gmu_text:
        table["gpu_memory_utilization"] = _parse_fraction(gmu_text)
    args = _parse_inline("args", values.get("args", ""))
    if args:
        table["args"] = args
    env = _parse_inline("env", values.get("env", ""))
    for key, value in env.items():
        if isinstance(value, (dict, list)):
            raise FieldError("env", f'{key} must be a string, e.g. {key} = "1"')
    if env:
        table["env"] = {k: str(v) for k, v in env.items()}
    return table


def _parse_name(name: str) -> str:
    if not _NAME.match(name):
        raise FieldError(
            "name",
            f"{name!r} is not a name: use letters, digits, '.', '_' or '-'"
            " (up to 63, starting with a letter or digit)",
        )
    return name


def _parse_gpus(gpus_text: str) -> list[int]:
    try:
        return [int(g) for g in re.split(r"[,\s]+", gpus_text) if g] if gpus_text else []
    except ValueError:
        raise FieldError(
            "gpus",
            f"{gpus_text!r} is not a list of GPU indices; write e.g. 0 or 0,1"
            " (blank for a CPU instance)",
        ) from None


def _parse_port(port_text: str) -> int:
    try:
        port = int(port_text)
    except ValueError:
        raise FieldError("port", f"{port_text!r} is not a port number; write e.g. 8000") from None
    if not 1 <= port <= 65535:
        raise FieldError("port", f"{port} is outside 1-65535")
    return port


def _parse_fraction(gmu_text: str) -> float:
    try:
        gmu = float(gmu_text)
    except ValueError:
        raise FieldError(
            "gpu_memory_utilization", f"{gmu_text!r} is not a fraction; write e.g. 0.45"
        ) from None
    if not 0 < gmu <= 1:
        raise FieldError("gpu_memory_utilization", f"{gmu} is not in (0, 1]")
    return gmu


def merged_table(
    existing: Mapping[str, Any] | None, form_table: Mapping[str, Any]
) -> dict[str, Any]:
    """An edited instance: the form's keys replace the old ones, a cleared field goes back to
    inheriting, and keys the form does not show are kept."""
    merged = {k: v for k, v in (existing or {}).items() if k not in FORM_KEYS}
    ordered = {k: form_table[k] for k in FORM_KEYS if k in form_table}
    return {**ordered, **merged}


def with_instance(
    toml_text: str, table: Mapping[str, Any], replace: str | None = None, path: str | None = None
) -> str:
    """The layout with `table` added, or replacing the instance named `replace`."""
    layout = parse(toml_text, path)
    if replace is not None and layout.instance(replace) is None:
        raise KeyError(replace)
    return dumps_layout(layout.with_instance(table, replace))


def without_instance(toml_text: str, name: str, path: str | None = None) -> str:
    """The layout with the instance `name` removed."""
    return dumps_layout(parse(toml_text, path).without_instance(name))
