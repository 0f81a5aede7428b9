"""The layout model: load, save, round trip, edits, and resolution into InstanceSpecs."""

from __future__ import annotations

import os
import string
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vsup.layout.diagnostics import LayoutError
from vsup.layout.model import (
    Layout,
    dumps_document,
    dumps_layout,
    load_layout,
    loads_layout,
    ordered,
)
from vsup.layout.spec import InstanceSpec, RestartPolicy
from vsup.layout.store import save_layout

CPU_LAYOUT = """\
[layout]
name = "t"

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"

[[instance]]
name = "a"
gpus = []
port = 8101
"""

# -- hypothesis strategies: any TOML document ------------------------------------------------

keys = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8)
bare_keys = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
atoms = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=20),
    st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31)),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.builds(
        lambda d, minutes: d.replace(tzinfo=timezone(timedelta(minutes=minutes))),
        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        st.integers(min_value=-23 * 60, max_value=23 * 60),
    ),
    st.times(),
)
values = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(keys, bare_keys), inner, max_size=4),
    ),
    max_leaves=20,
)
documents = st.dictionaries(st.one_of(keys, bare_keys), values, max_size=6)

# Layout-shaped documents: known sections and keys with values of any type.
known_keys = st.sampled_from(
    [
        "model",
        "command",
        "host",
        "args",
        "env",
        "restart",
        "gpus",
        "port",
        "name",
        "gpu_memory_utilization",
        "start_timeout_s",
        "api_key_env",
        "profiles",
        "metrics_listen",
    ]
)
tables = st.dictionaries(st.one_of(known_keys, bare_keys), values, max_size=6)
layout_documents = st.fixed_dictionaries(
    {},
    optional={
        "layout": tables,
        "defaults": tables,
        "instance": st.lists(tables, max_size=4),
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_document_survives_save_and_load_unchanged(doc):
    text = dumps_document(doc)
    first = loads_layout(text)
    assert not first.load_errors, text
    assert ordered(first.document) == ordered(doc)
    second = loads_layout(dumps_layout(first))
    assert second == first


@settings(max_examples=60, deadline=None)
@given(layout_documents)
def test_layout_load_save_load_is_identity(doc):
    first = loads_layout(dumps_document(doc))
    second = loads_layout(dumps_layout(first))
    assert second == first
    assert ordered(second.document) == ordered(doc)


def test_round_trip_keeps_key_order_and_unknown_keys(write):
    text = """\
[defaults]
host = "127.0.0.1"
model = "org/m"
args = { b = 1, a = 2 }
zzz_unknown = { x = [1, 2] }

[layout]
name = "n"

[[instance]]
port = 8000
name = "x"
gpus = [0]
"""
    layout = load_layout(write(text))
    again = loads_layout(dumps_layout(layout))
    assert again == layout
    assert list(again.document) == ["defaults", "layout", "instance"]
    assert list(again.defaults) == ["host", "model", "args", "zzz_unknown"]
    assert list(again.defaults["args"]) == ["b", "a"]
    assert list(again.instances[0]) == ["port", "name", "gpus"]


def test_dumps_writes_the_design_format():
    layout = Layout.from_tables(
        [{"name": "gpu0", "gpus": [0], "port": 8000, "gpu_memory_utilization": 0.9}],
        defaults={"model": "org/m", "args": {"max-model-len": 8192}, "env": {"A": "1"}},
        header={"name": "x", "profiles": ["rocm-mi300x"]},
    )
    assert dumps_layout(layout) == (
        '[layout]\nname = "x"\nprofiles = ["rocm-mi300x"]\n\n'
        '[defaults]\nmodel = "org/m"\nargs = { max-model-len = 8192 }\nenv = { A = "1" }\n\n'
        '[[instance]]\nname = "gpu0"\ngpus = [0]\nport = 8000\ngpu_memory_utilization = 0.9\n'
    )


def test_long_trailing_tables_become_sections_without_changing_order():
    args = {f"flag-number-{i}": i for i in range(12)}
    layout = Layout.from_tables([{"name": "a", "gpus": [], "port": 1, "args": args}])
    text = dumps_layout(layout)
    assert "[instance.args]" in text
    assert loads_layout(text) == layout


# -- loading never raises -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_loading_random_bytes_never_raises(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "l.toml"
    path.write_bytes(data)
    layout = load_layout(path)
    assert isinstance(layout, Layout)
    for d in layout.load_errors:
        assert d.is_error and d.file == str(path)


toml_ish = st.text(alphabet='[]{}=",.\n #abc01-_\'"\\tuef:', max_size=200)


@settings(max_examples=500, deadline=None)
@given(toml_ish)
def test_loading_random_toml_like_text_never_raises(text):
    layout = loads_layout(text, "x.toml")
    assert isinstance(layout, Layout)


def test_syntax_error_names_file_and_line(write):
    path = write('[layout]\nname = "x"\n\n[[instance]]\nname = \n')
    layout = load_layout(path)
    (d,) = layout.load_errors
    assert d.is_error and d.file == str(path) and d.line == 5
    assert "TOML syntax" in d.message


def test_deeply_nested_input_is_an_error_not_a_crash():
    layout = loads_layout("x = " + "[" * 50_000 + "]" * 50_000)
    assert isinstance(layout, Layout)


def test_missing_and_non_utf8_files_are_errors(tmp_path):
    missing = load_layout(tmp_path / "nope.toml")
    assert missing.load_errors and "cannot read" in missing.load_errors[0].message
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'name = "\xff"\n')
    layout = load_layout(bad)
    assert layout.load_errors and "UTF-8" in layout.load_errors[0].message


# -- saving ---------------------------------------------------------------------------------


def test_save_is_atomic_and_reads_back(tmp_path):
    layout = loads_layout(CPU_LAYOUT, tmp_path / "src.toml")
    target = tmp_path / "out" / "saved.toml"
    save_layout(layout, target, node_gpus=0, parents=True)
    assert load_layout(target) == layout
    assert [p.name for p in target.parent.iterdir()] == ["saved.toml"]  # no temp file left


def test_save_refuses_an_invalid_layout_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "keep.toml"
    target.write_text("# the good one\n")
    broken = loads_layout(CPU_LAYOUT.replace("port = 8101", "port = 99999"), tmp_path / "x.toml")
    with pytest.raises(LayoutError) as exc:
        save_layout(broken, target, node_gpus=0)
    assert "port 99999 is out of range" in str(exc.value)
    assert target.read_text() == "# the good one\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.toml"]


def test_save_into_a_missing_directory_needs_parents(tmp_path):
    layout = loads_layout(CPU_LAYOUT, tmp_path / "src.toml")
    with pytest.raises(LayoutError) as exc:
        save_layout(layout, tmp_path / "nowhere" / "saved.toml", node_gpus=0)
    assert "does not exist" in str(exc.value) and "--parents" in str(exc.value)
    assert not (tmp_path / "nowhere").exists()


def test_save_keeps_file_mode(tmp_path):
    target = tmp_path / "l.toml"
    target.write_text("")
    os.chmod(target, 0o600)
    save_layout(loads_layout(CPU_LAYOUT, target), target, node_gpus=0)
    assert os.stat(target).st_mode & 0o777 == 0o600


def test_save_elsewhere_rewrites_relative_model_paths(tmp_path):
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")  # a model vLLM could load: config and weights
    (model / "model.safetensors").write_bytes(b"")
    src = tmp_path / "layouts" / "a.toml"
    src.parent.mkdir()
    layout = loads_layout(CPU_LAYOUT.replace('"org/model"', '"../models/m"'), src)
    out = tmp_path / "deep" / "er" / "b.toml"
    save_layout(layout, out, node_gpus=0, parents=True)
    saved = load_layout(out)
    assert saved.defaults["model"] == "../../models/m"
    assert saved.resolve()[0].model == str(model)


# -- edits ----------------------------------------------------------------------------------


def test_with_instance_adds_replaces_and_renames():
    layout = loads_layout(CPU_LAYOUT)
    added = layout.with_instance({"name": "b", "gpus": [], "port": 8102})
    assert added.instance_names == ["a", "b"]
    assert layout.instance_names == ["a"]  # the original is untouched
    replaced = added.with_instance({"name": "a", "gpus": [], "port": 8200})
    a = replaced.instance("a")
    assert a is not None and a["port"] == 8200 and replaced.instance_names == ["a", "b"]
    renamed = replaced.with_instance({"name": "c", "gpus": [], "port": 8200}, replace_name="a")
    assert renamed.instance_names == ["c", "b"]
    assert renamed.source is None  # lines of the old text no longer apply


def test_without_instance_removes_or_says_which_is_missing():
    layout = loads_layout(CPU_LAYOUT).with_instance({"name": "b", "gpus": [], "port": 8102})
    assert layout.without_instance("a").instance_names == ["b"]
    with pytest.raises(KeyError, match="'zz'"):
        layout.without_instance("zz")


def test_from_tables_builds_a_layout_that_resolves(tmp_path):
    layout = Layout.from_tables(
        [{"name": "a", "gpus": [], "port": 8101}, {"name": "b", "gpus": [], "port": 8102}],
        defaults={"model": "org/m", "host": "127.0.0.1"},
        header={"name": "built"},
    )
    specs = layout.resolve(profile_dirs=[])
    assert [s.name for s in specs] == ["a", "b"] and specs[1].port == 8102
    assert layout.name == "built"


def test_with_header_and_defaults():
    layout = loads_layout(CPU_LAYOUT).with_header(profiles=["cpu"], name=None)
    assert layout.profiles == ["cpu"] and "name" not in layout.header
    layout = layout.with_defaults({"model": "x/y"})
    assert layout.defaults == {"model": "x/y"}
    assert list(layout.document) == ["layout", "defaults", "instance"]


# -- resolve --------------------------------------------------------------------------------


def _profile(dir_: Path, name: str, body: str) -> None:
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / f"{name}.toml").write_text(f'[profile]\ndescription = "{name}"\n\n[defaults]\n{body}\n')


def test_merge_order_builtin_profiles_defaults_instance(tmp_path):
    profiles = tmp_path / "p"
    _profile(
        profiles,
        "one",
        'host = "192.0.2.1"\nstart_timeout_s = 100\n'
        'args = { max-num-seqs = 1, dtype = "float32", enforce-eager = true }\n'
        'env = { A = "1", B = "1" }\nrestart = { policy = "always", backoff_s = 1 }',
    )
    _profile(
        profiles, "two", 'start_timeout_s = 200\nargs = { max-num-seqs = 2 }\nenv = { B = "2" }'
    )
    text = """\
[layout]
profiles = ["one", "two"]

[defaults]
model = "org/m"
args = { max_num_seqs = 3, block-size = 16 }
env = { C = 3 }
restart = { max_failures = 9 }

[[instance]]
name = "a"
gpus = [0, 1]
port = 8000
args = { enforce-eager = false, max-model-len = 512 }
restart = { backoff_s = 7 }

[[instance]]
name = "b"
gpus = []
port = 8001
host = "127.0.0.1"
start_timeout_s = 5
"""
    a, b = loads_layout(text, tmp_path / "l.toml").resolve(profile_dirs=[profiles])
    assert isinstance(a, InstanceSpec)
    assert a.host == "192.0.2.1" and b.host == "127.0.0.1"
    assert a.start_timeout_s == 200 and b.start_timeout_s == 5
    assert a.command == ("vllm", "serve")  # built-in
    assert dict(a.args) == {
        "dtype": "float32",
        "max_num_seqs": 3,
        "block-size": 16,
        "max-model-len": 512,
    }
    assert "enforce-eager" in b.args  # only instance a switched it off
    assert dict(a.env) == {"A": "1", "B": "2", "C": "3"}
    assert a.restart == RestartPolicy(policy="always", backoff_s=7, max_failures=9)
    assert b.restart.backoff_s == 1
    assert a.profiles == ("one", "two")
    assert a.load_tracking and b.load_tracking
    assert a.argv() == [
        "vllm",
        "serve",
        "--model",
        "org/m",
        "--host",
        "192.0.2.1",
        "--port",
        "8000",
        "--enable-server-load-tracking",  # the installed vLLM (0.32) has it
        "--dtype",
        "float32",
        "--max-num-seqs",
        "3",
        "--block-size",
        "16",
        "--max-model-len",
        "512",
        "--tensor-parallel-size",
        "2",
    ]
    assert "--enforce-eager" not in a.argv() and "--enforce-eager" in b.argv()


def test_relative_and_home_model_paths_resolve(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "home" / "hm").mkdir(parents=True)
    text = CPU_LAYOUT + '\n[[instance]]\nname = "b"\ngpus = []\nport = 8102\nmodel = "~/hm"\n'
    text = text.replace('"org/model"', '"../models/m"')
    a, b = loads_layout(text, tmp_path / "layouts" / "l.toml").resolve(profile_dirs=[])
    assert a.model == str(tmp_path / "models" / "m")
    assert b.model == str(tmp_path / "home" / "hm")


def test_resolve_raises_with_every_blocking_error():
    text = CPU_LAYOUT.replace('name = "a"', "name = 5").replace("port = 8101", 'port = "x"')
    with pytest.raises(LayoutError) as exc:
        loads_layout(text, "l.toml").resolve(profile_dirs=[])
    keys = sorted(d.key or "" for d in exc.value.errors)
    assert keys == ["name", "port"]


def test_equality_ignores_source_but_not_order():
    a = loads_layout("x = 1\ny = 2\n")
    assert a == loads_layout("x = 1\n\n\ny = 2 # c\n")
    assert a != loads_layout("y = 2\nx = 1\n")


def test_dates_and_times_round_trip():
    doc = {
        "t": {"d": date(2024, 1, 2), "dt": datetime(2024, 1, 2, 3, 4, 5, 600), "tm": time(1, 2, 3)}
    }
    assert ordered(loads_layout(dumps_document(doc)).document) == ordered(doc)


# Values a layout's keys are likely to be given, right or wrong.
plausible = st.one_of(
    values,
    st.sampled_from(
        [0, 1, 8000, -1, 0.45, 1.5, "", "org/m", "./m", "~/m", "/", "vllm", "on-failure", "8k"]
    ),
    st.lists(st.integers(min_value=-2, max_value=9), max_size=4),
    st.dictionaries(
        st.sampled_from(
            [
                "max-model-len",
                "tensor-parallel-size",
                "block-size",
                "api-key",
                "port",
                "num-gpu-blocks-override",
                "max-num-seqs",
                "quantization",
                "policy",
                "backoff_s",
                "VLLM_ROCM_USE_AITER",
                "NCCL_MIN_NCHANNELS",
                "HIP_VISIBLE_DEVICES",
            ]
        ),
        st.one_of(
            st.integers(min_value=-5, max_value=10_000),
            st.text(max_size=5),
            st.booleans(),
            st.floats(),
        ),
        max_size=4,
    ),
)
plausible_tables = st.dictionaries(known_keys, plausible, max_size=8)
plausible_layouts = st.fixed_dictionaries(
    {},
    optional={
        "layout": plausible_tables,
        "defaults": plausible_tables,
        "instance": st.lists(plausible_tables, max_size=4),
        "stray": plausible,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plausible_layouts, st.one_of(st.none(), st.integers(min_value=0, max_value=8)))
def test_validate_and_resolve_never_crash_on_any_layout(doc, node_gpus):
    from vsup.layout.validate import validate

    layout = loads_layout(dumps_document(doc), "/nonexistent/l.toml")
    diagnostics = validate(layout, node_gpus=node_gpus, profile_dirs=[])
    assert all(d.severity in ("error", "warning") and d.message for d in diagnostics)
    try:
        specs = layout.resolve(profile_dirs=[])
    except LayoutError as exc:
        assert exc.errors
    else:
        assert len(specs) == len(layout.instances)
        for spec in specs:
            spec.argv()
            spec.child_env({})


well_typed_instances = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["a", "b", "gpu0", "x.y", "bad name"]),
            "gpus": st.lists(st.integers(min_value=-1, max_value=9), max_size=3),
            "port": st.integers(min_value=-1, max_value=70000),
        },
        optional={
            "model": st.sampled_from(
                ["org/m", "meta-llama/Llama-3.1-8B-Instruct", "./missing", ""]
            ),
            "gpu_memory_utilization": st.floats(min_value=-0.5, max_value=1.5),
            "args": st.dictionaries(
                st.sampled_from(
                    [
                        "max-model-len",
                        "tensor-parallel-size",
                        "tp",
                        "block-size",
                        "max-num-seqs",
                        "max-num-batched-tokens",
                        "num-gpu-blocks-override",
                        "quantization",
                        "enforce-eager",
                        "compilation-config",
                        "pipeline-parallel-size",
                    ]
                ),
                st.one_of(
                    st.integers(min_value=-2, max_value=5000),
                    st.booleans(),
                    st.sampled_from(["fp8", "8k", "auto", "x"]),
                    st.just({"mode": 3}),
                ),
                max_size=4,
            ),
            "env": st.dictionaries(
                st.sampled_from(
                    ["VLLM_ROCM_USE_AITER", "NCCL_MIN_NCHANNELS", "VLLM_CPU_KVCACHE_SPACE", "A"]
                ),
                st.one_of(
                    st.sampled_from(["1", "0", "x", "2.5"]), st.integers(min_value=0, max_value=4)
                ),
                max_size=3,
            ),
            "restart": st.fixed_dictionaries(
                {},
                optional={
                    "policy": st.sampled_from(["always", "never", "on-failure"]),
                    "backoff_s": st.floats(min_value=0, max_value=100),
                    "max_failures": st.integers(min_value=1, max_value=9),
                },
            ),
        },
    ),
    max_size=4,
)


def _sane(instances: list[dict]) -> list[dict]:
    """The same drawn instances with the values that always fail validation pulled into range
    (unique usable names, GPUs 0-3 listed once, a port, a small memory fraction, the layout's
    model), so that layouts without errors are drawn often; args, env and restart as drawn."""
    out: list[dict] = []
    for table in instances:
        if table["name"] == "bad name" or table["name"] in {t["name"] for t in out}:
            continue
        table = {k: v for k, v in table.items() if k != "model"}
        table["gpus"] = sorted({g for g in table["gpus"] if 0 <= g <= 3})
        table["port"] = min(max(table["port"], 1), 65535)
        if "gpu_memory_utilization" in table:
            table["gpu_memory_utilization"] = min(max(table["gpu_memory_utilization"], 0.05), 0.25)
        out.append(table)
    return out


def test_a_layout_without_errors_always_resolves():
    """Every layout that validates without errors resolves. Layouts with errors are not
    examples (`assume`), and the test fails unless enough layouts without errors were drawn,
    so it cannot pass by drawing only erroring ones."""
    from vsup.layout.validate import validate

    resolved: list[int] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        well_typed_instances.map(_sane),
        st.sampled_from(["org/m", "meta-llama/Llama-3.1-8B-Instruct"]),
        st.one_of(st.none(), st.integers(min_value=4, max_value=8)),
    )
    def resolves(instances, model, node_gpus):
        layout = Layout.from_tables(
            instances, defaults={"model": model, "command": ["python"]}, path="/tmp/none/l.toml"
        )
        diagnostics = validate(layout, node_gpus=node_gpus, profile_dirs=[])
        assume(not any(d.is_error for d in diagnostics))
        specs = layout.resolve(profile_dirs=[])
        assert [s.name for s in specs] == [t["name"] for t in instances]
        for spec in specs:
            assert spec.argv()[:1] == ["python"]
            assert 1 <= spec.port <= 65535
        resolved.append(len(specs))

    resolves()
    assert len(resolved) >= MIN_VALID_LAYOUTS, f"only {len(resolved)} layouts without errors"
    assert max(resolved) >= 2, resolved  # and some with several instances


MIN_VALID_LAYOUTS = 100
