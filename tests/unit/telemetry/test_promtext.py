"""promtext's sample-line parser gives prometheus_client's results, line for line.

The reference is prometheus_client's own text parser (`text_string_to_metric_families`) run on
the same single line. Generated lines cover what the text format allows in a sample: escaped
quotes, backslashes and newlines in label values, unknown escapes (kept verbatim), commas,
braces and `=` inside values, whitespace around terms, leading/trailing commas, NaN, +Inf,
-Inf, exponents, big integers and timestamps; a second property throws malformed tails at both.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from vsup.telemetry.promtext import parse_sample, unescape_label_value

NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
LABEL_NAME = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not n.startswith("__")
)
# A label value as written on the wire: plain characters, or a backslash and any character
# (the three defined escapes and unknown ones that must survive verbatim).
PLAIN = st.characters(blacklist_characters='"\\\n', blacklist_categories=["Cs"])
WIRE_VALUE = st.lists(
    st.one_of(
        PLAIN,
        st.sampled_from(['\\"', "\\\\", "\\n", "\\t", "\\x", ",", "}", "{", "=", " ", '\\\\"']),
    ),
    max_size=12,
).map("".join)
SPACE = st.sampled_from(["", "", " ", "  ", "\t"])
NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:e}"),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.17g}"),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(
        [
            "NaN",
            "nan",
            "+Inf",
            "-Inf",
            "Inf",
            "inf",
            "1e3",
            "1E+3",
            "-1.5e-07",
            "+0",
            "-0.0",
            "1.7959906667109358e+09",
            "0x10",
            "1_000",
            "",
            "1.2.3",
            "Infinity",
            "one",
        ]
    ),
)


@st.composite
def sample_lines(draw: st.DrawFn) -> str:
    name = draw(NAME)
    labels = draw(st.dictionaries(LABEL_NAME, WIRE_VALUE, max_size=5))
    line = name
    if bool(labels) or draw(st.booleans()):
        terms = [
            f'{draw(SPACE)}{k}{draw(SPACE)}={draw(SPACE)}"{v}"{draw(SPACE)}'
            for k, v in labels.items()
        ]
        body = ",".join(terms)
        if draw(st.booleans()) and terms:
            body += ","
        if draw(st.integers(0, 5)) == 0:
            body = "," + body
        line += draw(st.sampled_from(["", " "])) + "{" + body + "}"
        line += draw(st.sampled_from([" ", " ", "\t", "  ", ""]))
    else:
        line += draw(st.sampled_from([" ", "\t", "  "]))
    line += draw(NUMBER)
    if draw(st.booleans()):
        line += " " + draw(st.one_of(st.integers(0, 2**63).map(str), NUMBER))
    return line


def reference(line: str):
    """prometheus_client's reading of one line: (name, labels, value) or the exception."""
    try:
        families = list(text_string_to_metric_families(line + "\n"))
    except Exception as exc:
        return exc
    samples = [s for f in families for s in f.samples]
    assert len(samples) == 1
    s = samples[0]
    return (s.name, dict(s.labels), float(s.value))


def ours(line: str):
    try:
        s = parse_sample(line)
    except ValueError as exc:
        return exc
    return (s.name, s.labels, s.value)


def same(a, b) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return isinstance(a, Exception) and isinstance(b, Exception)
    if a[:2] != b[:2]:
        return False
    x, y = a[2], b[2]
    return (math.isnan(x) and math.isnan(y)) or x == y


@settings(max_examples=400, deadline=None)
@given(sample_lines())
@example('vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0"} 1.0')
@example('m{path="C:\\\\dir\\"x\\"",msg="a,b}c=d\\nnext"} +Inf')
@example('m{a="\\q"} -1.5e-07 1700000000000')
@example('m{,a="1"} NaN')
@example('m{a="1",} 2')
@example('m{a="1",,b="2"} 2')
@example('m{a="1" b="2"} 2')
@example('m{__name__="x"} 1')
@example('m{a="1",a="2"} 1')
@example("m 1_000")
@example("m 123456789012345678901234567890")
def test_sample_lines_parse_as_prometheus_client_parses_them(line: str) -> None:
    assert same(ours(line), reference(line)), (line, ours(line), reference(line))


TAIL = st.text(alphabet='ab=",{}\\ \t1e.+-_#nN:', max_size=30)


@settings(max_examples=400, deadline=None)
@given(NAME, st.sampled_from(["", " ", "\t", "{", " {", '{a="']), TAIL)
def test_malformed_lines_are_never_read_differently_from_prometheus_client(
    name: str, joint: str, tail: str
) -> None:
    """On garbage the only allowed disagreement is the safe one: prometheus_client reads some
    broken label sets leniently (`m{a=}1` as `m 1`), we refuse them. Whatever we accept,
    prometheus_client accepts with the same name, labels and value, and whatever it refuses,
    we refuse."""
    line = name + joint + tail
    # prometheus_client takes everything before the first unquoted `{` as the metric name
    # without checking it; we insist on a real name there. Only lines where the two agree on
    # what the name is are comparable.
    brace = _first_unquoted(line, "{")
    if brace >= 0:
        assume(re.fullmatch(r"\s*[a-zA-Z_:][a-zA-Z0-9_:]*\s*", line[:brace]) is not None)
        assume(" # " not in line[:brace])
    else:
        assume(joint in (" ", "\t") or tail[:1] in (" ", "\t"))
    assume(not line.strip().startswith("#"))
    got, ref = ours(line), reference(line)
    if isinstance(got, Exception):
        # we refuse: so does prometheus_client, or it is the one known lenient reading
        assert isinstance(ref, Exception) or LENIENT_LABELS.search(line), (line, got, ref)
    else:
        assert same(got, ref), (line, got, ref)


# The disagreement allowed above: a label set whose value is missing (`{a=}`, `{=}`), which
# prometheus_client reads as no labels at all.
LENIENT_LABELS = re.compile(r'\{[^"}]*=\s*\}')


@pytest.mark.parametrize("line", [":{=}1", "m{a=}1", "m{=}1"])
def test_label_sets_prometheus_client_reads_leniently_are_refused(line: str) -> None:
    assert isinstance(ours(line), Exception)
    assert not isinstance(reference(line), Exception)
    assert LENIENT_LABELS.search(line)


def _first_unquoted(text: str, ch: str) -> int:
    quoted = False
    for i, c in enumerate(text):
        if c == '"' and not _escaped(text, i):
            quoted = not quoted
        elif c == ch and not quoted:
            return i
    return -1


def _escaped(text: str, i: int) -> bool:
    n = 0
    while i - 1 - n >= 0 and text[i - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


@pytest.mark.parametrize(
    "wire, value",
    [
        ("plain", "plain"),
        ('say \\"hi\\"', 'say "hi"'),
        ("back\\\\slash", "back\\slash"),
        ("two\\nlines", "two\nlines"),
        ("tab\\tstays", "tab\\tstays"),
        ("\\\\n", "\\n"),
    ],
)
def test_label_values_unescape_the_three_defined_escapes_only(wire: str, value: str) -> None:
    assert unescape_label_value(wire) == value
    assert parse_sample(f'm{{v="{wire}"}} 1').labels == {"v": value}
