"""Where `stall_after_s` goes (issue 35, item 17): the on-call docs (then the README) said "per
layout", an operator wrote it in `[layout]`, and `[layout]` refuses it. It is an instance key
(InstanceSpec, control/stalls.py reads it per instance; docs/layout.md lists it with the
instance keys), so the layout-wide place is `[defaults]`: docs/oncall.md names exactly the
places that take it, and `[layout]` says where it belongs."""

from __future__ import annotations

import re
from pathlib import Path

from vsup.layout.model import loads_layout
from vsup.layout.validate import validate

REPO = Path(__file__).resolve().parents[3]

LAYOUT = """\
[layout]
name = "x"
{layout}

[defaults]
model = "org/model"
{defaults}

[[instance]]
name = "g0"
gpus = [0]
port = 8000
{instance}
"""


def diagnostics(**tables: str) -> list[str]:
    text = LAYOUT.format(**{"layout": "", "defaults": "", "instance": "", **tables})
    return [d.format() for d in validate(loads_layout(text, "l.toml"), node_gpus=1)]


def test_the_docs_name_the_places_that_take_stall_after_s():
    oncall = " ".join((REPO / "docs" / "oncall.md").read_text().split())
    m = re.search(r"makes no progress at all for `stall_after_s` \(([^)]*)\)", oncall)
    assert m, "docs/oncall.md: the sentence that says where stall_after_s goes"
    places = re.findall(r"`(\[\[?\w+\]\]?)`", m.group(1))
    assert places == ["[defaults]", "[[instance]]"], m.group(1)
    for place in places:
        table = place.strip("[]")
        said = [d for d in diagnostics(**{table: "stall_after_s = 30"}) if "stall_after_s" in d]
        assert said == [], (place, said)
    (refused,) = [d for d in diagnostics(layout="stall_after_s = 30") if "stall_after_s" in d]
    assert "belongs in [defaults] (or an [[instance]] table), not [layout]" in refused
