"""Saving over an operator's layout file keeps their comments and formatting (issue 25)."""

from __future__ import annotations

import tomllib

import pytest

from vsup.layout.diagnostics import LayoutError
from vsup.layout.model import load_layout, loads_layout
from vsup.layout.store import save_layout

COMMENTED = """\
# Night shift: two replicas of the small model. Ask Ana before changing gpus.
[layout]
name = "t"   # the name the dashboard shows

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"
args = { max-model-len = 4096,  enforce-eager = true }   # eager: CPU build

# the first replica
[[instance]]
name = "a"
gpus = []
port = 8101   # behind the router

# the second replica: goes away on Fridays
[[instance]]
name = "b"
gpus = []
port = 8102
"""


def _edited(path):
    """The running layout after the dashboard changed b's port and added c."""
    layout = load_layout(path)
    b = dict(layout.instances[1], port=8103)
    layout = layout.with_instance(b, "b")
    return layout.with_instance({"name": "c", "gpus": [], "port": 8104, "args": {"seed": 1}})


def test_saving_over_the_layout_file_keeps_its_comments_and_formatting(tmp_path):
    path = tmp_path / "night.toml"
    path.write_text(COMMENTED)
    layout = _edited(path)
    saved = save_layout(layout, path, node_gpus=0)
    text = path.read_text()
    assert saved.kept and saved.lost is None
    for kept in (
        "# Night shift: two replicas of the small model. Ask Ana before changing gpus.\n",
        'name = "t"   # the name the dashboard shows\n',
        "args = { max-model-len = 4096,  enforce-eager = true }   # eager: CPU build\n",
        "# the first replica\n[[instance]]\n",
        "port = 8101   # behind the router\n",
        "# the second replica: goes away on Fridays\n",
    ):
        assert kept in text
    assert "port = 8103\n" in text and 'name = "c"' in text and "args = {seed = 1}" in text
    assert tomllib.loads(text) == layout.document and load_layout(path) == layout
    assert [p.name for p in tmp_path.iterdir()] == ["night.toml"]  # no temp file left


def test_a_changed_value_keeps_the_comment_of_its_line_and_a_removed_table_goes(tmp_path):
    path = tmp_path / "night.toml"
    path.write_text(COMMENTED)
    layout = load_layout(path)
    layout = layout.with_instance(dict(layout.instances[0], port=8109), "a").without_instance("b")
    saved = save_layout(layout, path, node_gpus=0)
    assert saved.kept and saved.lost is None
    text = path.read_text()
    assert "port = 8109   # behind the router\n" in text and "# the first replica" in text
    assert 'name = "b"' not in text and load_layout(path) == layout


def test_a_new_file_keeps_the_comments_of_the_layout_as_applied(tmp_path):
    src = tmp_path / "night.toml"
    src.write_text(COMMENTED)
    out = tmp_path / "copy.toml"
    saved = save_layout(load_layout(src), out, node_gpus=0, keep_from=COMMENTED)
    assert saved.kept and out.read_text() == COMMENTED


def test_what_cannot_be_kept_is_said_plainly(tmp_path):
    path = tmp_path / "night.toml"
    path.write_text("this is [not TOML\n")
    layout = loads_layout(COMMENTED, tmp_path / "src.toml")
    saved = save_layout(layout, path, node_gpus=0)
    assert not saved.kept
    assert saved.lost == (
        f"the comments and formatting of {path} could not be kept (it was rewritten in "
        "vsup's own format)"
    )
    assert load_layout(path) == layout


def test_an_invalid_layout_is_still_refused_and_the_file_untouched(tmp_path):
    path = tmp_path / "night.toml"
    path.write_text(COMMENTED)
    layout = load_layout(path)
    broken = layout.with_instance(dict(layout.instances[1], port=8101), "b")
    with pytest.raises(LayoutError) as exc:
        save_layout(broken, path, node_gpus=0)
    assert "port 8101 is also used" in str(exc.value)
    assert path.read_text() == COMMENTED


def test_the_save_goes_through_the_atomic_writer(tmp_path, monkeypatch):
    import vsup.layout.store as store

    calls = []
    real = store.write_atomic
    monkeypatch.setattr(store, "write_atomic", lambda p, t: calls.append(p) or real(p, t))  # type: ignore[func-returns-value]  # a spy
    path = tmp_path / "night.toml"
    path.write_text(COMMENTED)
    save_layout(_edited(path), path, node_gpus=0)
    assert calls == [path]


HEADED = """\
[layout]
name = "t"

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"

# a: the first replica
[[instance]]
name = "a"
args.max-model-len = 4096   # dotted keys: as the operator wrote them
args.enforce-eager = true
gpus = []
port = 8101

# b: goes away on Fridays
[[instance]]
name = "b"
gpus = []
port = 8102

# c: the third, keep it
[[instance]]
name = "c"
gpus = []
port = 8103
"""


def _save(tmp_path, edit):
    path = tmp_path / "night.toml"
    path.write_text(HEADED)
    layout = edit(load_layout(path))
    saved = save_layout(layout, path, node_gpus=0)
    assert saved.kept and saved.lost is None and load_layout(path) == layout
    return path.read_text()


def test_a_changed_dotted_key_keeps_its_line_and_comment(tmp_path):
    # tomlkit gives dotted keys (`args.x = 1`) as a proxy table: it used to be rewritten as
    # `args = {...}` at the end of the table, its comment gone, and reported as kept
    def edit(layout):
        a = dict(layout.instances[0], args={"max-model-len": 8192, "enforce-eager": True})
        return layout.with_instance(a, "a")

    text = _save(tmp_path, edit)
    assert (
        "args.max-model-len = 8192   # dotted keys: as the operator wrote them\n"
        "args.enforce-eager = true\n"
    ) in text


@pytest.mark.parametrize("gone", ["a", "b", "c"])
def test_a_removed_instance_takes_the_comment_above_it_and_leaves_the_others(tmp_path, gone):
    # tomlkit files the comment above `[[instance]]` at the end of the table before it: a
    # removal used to drop the next instance's comment and leave the removed one's behind
    text = _save(tmp_path, lambda layout: layout.without_instance(gone))
    comments = {
        "a": '# a: the first replica\n[[instance]]\nname = "a"',
        "b": '# b: goes away on Fridays\n[[instance]]\nname = "b"',
        "c": '# c: the third, keep it\n[[instance]]\nname = "c"',
    }
    for name, block in comments.items():
        if name == gone:
            assert block.split("\n")[0] not in text, text
        else:
            assert block in text, text


def test_added_keys_and_instances_go_above_the_comment_of_what_follows(tmp_path):
    def edit(layout):
        a = dict(layout.instances[0], gpu_memory_utilization=0.5)
        layout = layout.with_instance(a, "a")
        return layout.with_instance({"name": "d", "gpus": [], "port": 8104})

    text = _save(tmp_path, edit)
    assert (
        "port = 8101\ngpu_memory_utilization = 0.5\n\n# b: goes away on Fridays\n[[instance]]\n"
        in text
    )
    assert '\n# c: the third, keep it\n[[instance]]\nname = "c"' in text
    assert text.endswith('[[instance]]\nname = "d"\ngpus = []\nport = 8104\n'), text
