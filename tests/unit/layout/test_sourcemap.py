"""Lines of tables and keys found by scanning the TOML text."""

from __future__ import annotations

from vsup.layout.sourcemap import SourceMap

TEXT = '''\
# comment
[layout]
name = "x"
note = """
[[instance]]
port = 1
"""

[defaults]
args = { max-model-len = 8192, "quoted.key" = 1 }
env.A = "1"

[[instance]]
name = "a"
port = 8000

[[instance]]
name = "b"

[instance.args]
block-size = 1

[instance.restart]
policy = "always"
'''


def test_tables_keys_and_array_entries():
    m = SourceMap(TEXT)
    assert m.line(("layout",)) == 2
    assert m.line(("layout", "note")) == 4
    assert m.line(("defaults", "args")) == 10
    assert m.line(("defaults", "args", "max-model-len")) == 10
    assert m.line(("defaults", "args", "quoted.key")) == 10
    assert m.line(("defaults", "env", "A")) == 11
    assert m.line(("instance", 0)) == 13  # the [[instance]] inside the string is not a header
    assert m.line(("instance", 0, "port")) == 15
    assert m.line(("instance", 1, "args", "block-size")) == 21
    assert m.line(("instance", 1, "restart", "policy")) == 24


def test_unknown_paths_fall_back_to_the_enclosing_table():
    m = SourceMap(TEXT)
    assert m.line(("instance", 1, "gpus")) == 17
    assert m.line(("instance", 1, "args", "nope")) == 20
    assert m.line(("nothing",)) is None
    assert SourceMap(None).line(("layout",)) is None
