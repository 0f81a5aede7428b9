"""Prometheus text exposition format: one sample line at a time, fast.

vsup reads about ten samples out of a ~50 KB vLLM `/metrics` payload per instance per second.
prometheus_client's parser walks label sets character by character (the `cache_config_info`
line alone has ~40 labels), so a full parse costs far more than the few samples are worth
(docs/benchmarks.md); this module parses only the lines the caller picked out, with a few
regular expressions.

It follows prometheus_client's text parser (`text_string_to_metric_families`, non-OpenMetrics)
on every sample line written with an unquoted metric name: label values with escaped quotes,
backslashes and newlines, commas, braces and `=` inside quotes, whitespace around terms, a
leading or trailing comma, reserved `__` label names, NaN, +Inf/-Inf, exponents, integers beyond
float precision, an optional timestamp - accepting what it accepts and rejecting what it rejects.
The property tests in tests/unit/telemetry/test_promtext.py hold the two to the same results.
Not covered (no vLLM writes them): quoted UTF-8 metric or label names, exemplars.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# One `name="value"` term. The value is runs of non-quote, non-backslash characters joined by
# backslash pairs: that is how an unescaped quote is told from an escaped one (written as an
# unrolled loop, which sre runs much faster than an alternation per character). Label names
# follow prometheus_client: the legacy metric-name alphabet (so `:` is allowed).
_LABEL = re.compile(r'\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*=\s*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"\s*')
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# The shape every client library writes (no blanks, no leading comma): the whole label set
# checked by one match and split by one findall, both in C. Anything else takes the slow path.
_PAIR_SRC = r'[a-zA-Z_:][a-zA-Z0-9_:]*="[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_TIGHT = re.compile(r"\{(?:" + _PAIR_SRC + r",)*(?:" + _PAIR_SRC + r",?)?\}")
_PAIR = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)="([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
# The text format defines exactly three escapes in label values; any other backslash stays.
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def unescape_label_value(raw: str) -> str:
    """Undo the text format's label-value escaping (`\\\\`, `\\n`, `\\"`)."""
    if "\\" not in raw:
        return raw
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], raw)


def parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse the label set whose `{` is at `line[pos]`; return the labels and the index just
    after the closing `}`. Raises ValueError on a malformed, reserved or duplicated label."""
    tight = _TIGHT.match(line, pos)
    if tight is not None:
        pairs = _PAIR.findall(line, pos, tight.end())
        labels = {k: unescape_label_value(v) for k, v in pairs}
        if len(labels) == len(pairs) and not any(k.startswith("__") for k in labels):
            return labels, tight.end()
        raise ValueError("duplicate or reserved label name")
    labels = {}
    n = len(line)
    i = pos + 1
    first = True
    while True:
        while i < n and line[i].isspace():
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        if first and i < n and line[i] == ",":
            i += 1  # prometheus_client tolerates one leading comma
            while i < n and line[i].isspace():
                i += 1
            if i < n and line[i] == "}":
                return labels, i + 1
        first = False
        m = _LABEL.match(line, i)
        if m is None:
            raise ValueError(f"malformed label set at column {i}")
        name = m.group(1)
        if name.startswith("__"):
            raise ValueError(f"reserved label name {name!r}")
        if name in labels:
            raise ValueError(f"duplicate label {name!r}")
        labels[name] = unescape_label_value(m.group(2))
        i = m.end()
        if i < n and line[i] == ",":
            i += 1
            j = i
            while j < n and line[j].isspace():
                j += 1
            if j < n and line[j] == ",":
                raise ValueError("two commas in a label set")
        elif i < n and line[i] == "}":
            return labels, i + 1
        else:
            raise ValueError(f"expected ',' or '}}' at column {i}")


def _number(raw: str) -> float:
    if raw != raw.strip() or "_" in raw:
        raise ValueError(f"invalid number {raw!r}")
    return float(raw)


def parse_value(text: str) -> float:
    """The value after the name and labels. Like prometheus_client: fields are split on spaces
    (on tabs when there is no space), the first is the value, a last one is a timestamp that
    must be a number too and is ignored. Go's and Python's float syntax agree on what vLLM
    writes (`1`, `1.5e+09`, `NaN`, `+Inf`, `-Inf`); underscores are refused."""
    s = text.lstrip()
    sep = " " if " " in s else "\t"
    fields = [f.strip() for f in s.split(sep) if f.strip()]
    if not fields:
        raise ValueError("a sample needs a value")
    value = _number(fields[0])
    if len(fields) > 1:
        _number(fields[-1])
    return value


def parse_sample(line: str) -> Sample:
    """Parse one sample line (`name{labels} value [timestamp]`). Raises ValueError."""
    line = line.strip()
    m = _NAME.match(line)
    if m is None:
        raise ValueError("a sample line starts with a metric name")
    name = m.group(0)
    i = m.end()
    n = len(line)
    j = i
    while j < n and line[j].isspace():
        j += 1
    if j < n and line[j] == "{":
        labels, end = parse_labels(line, j)
        return Sample(name, labels, parse_value(line[end:]))
    if i < n and line[i] not in " \t":
        raise ValueError("the metric name must be followed by labels or whitespace")
    return Sample(name, {}, parse_value(line[i + 1 :]))
