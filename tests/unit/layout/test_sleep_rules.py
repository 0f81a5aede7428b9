"""Sleep mode in layouts: every rule about `sleep` and `swap_group` (both sides), the GPU budget
that counts a swap group by its largest member, the level-1 sleepers' host RAM, and
`vsup validate` showing the groups. docs/layout.md, "Time-sharing a GPU: swap groups and sleep".
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout import vllm_flags
from vsup.layout.diagnostics import Diagnostic
from vsup.layout.model import loads_layout
from vsup.layout.node import GIB, KNOWN_GPUS, NodeFacts, NodeGpu
from vsup.layout.timeshare import SLEEPER_RESERVE_BYTES, SLEEPER_RESERVE_SHARE_UNKNOWN
from vsup.layout.validate import validate

H200 = KNOWN_GPUS["H200"][1]
LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA_8B_BYTES = 8_030_261_248 * 2  # bf16, as vsup plan sizes it from the config

# Two instances that time-share GPU 0, as the docs show them.
GROUP = """\
[layout]
name = "swap"

[defaults]
model = "org/model"
host = "127.0.0.1"

[[instance]]
name = "a"
gpus = [0]
port = 8000
gpu_memory_utilization = 0.9
swap_group = "g0"
sleep = { level = 1 }

[[instance]]
name = "b"
gpus = [0]
port = 8001
gpu_memory_utilization = 0.9
swap_group = "g0"
sleep = { level = 1, after_idle_s = 300 }
"""


def node(gpus: int = 2, host_gib: float | None = None, memory: int | None = H200) -> NodeFacts:
    return NodeFacts(
        tuple(NodeGpu(i, "NVIDIA H200", memory, "nvidia") for i in range(gpus)),
        host_memory_bytes=int(host_gib * GIB) if host_gib else None,
    )


def check(text: str, facts: NodeFacts | None = None, path: str = "/tmp/swap.toml"):
    return validate(loads_layout(text, path), node=facts or node())


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) >= count, old
    return text.replace(old, new, count)


def only(diagnostics: list[Diagnostic], words: str) -> Diagnostic:
    found = [d for d in diagnostics if words in d.message]
    assert len(found) == 1, [d.format() for d in diagnostics]
    return found[0]


def none_say(diagnostics: list[Diagnostic], words: str) -> None:
    assert not [d for d in diagnostics if words in d.message], [d.format() for d in diagnostics]


def test_a_group_of_two_at_090_on_one_gpu_validates_and_without_sleep_mode_does_not():
    assert check(GROUP) == []
    # no group, still sleep mode: evicted by memory (one awake, the other asleep, fits)
    pooled = GROUP.replace('swap_group = "g0"\n', "")
    assert [d for d in check(pooled) if d.is_error] == []
    alone = check(edit(pooled, "sleep = { level = 1 }\n", ""))
    errors = [d for d in alone if d.is_error]
    assert {d.instance for d in errors} == {"a", "b"}
    assert all("GPU 0 is over-committed" in d.message and "1.80" in d.message for d in errors)
    assert errors[0].key == "gpu_memory_utilization" and errors[0].file == "/tmp/swap.toml"


def test_a_group_counts_its_largest_member_plus_each_sleepers_remainder():
    # beside a third instance: 0.9 awake + 0.05 + one sleeper's 2 GiB of 140 GiB > 0.95
    third = GROUP + '\n[[instance]]\nname = "c"\ngpus = [0]\nport = 8002\n'
    third += "gpu_memory_utilization = 0.05\n"
    e = only([d for d in check(third) if d.is_error and d.instance == "c"], "over-committed")
    assert "0.96" in e.message and "'c' 0.05" in e.message
    assert "put the others into the swap group" in e.message
    assert "swap group g0 ('a', 'b') 0.9 for the one awake + 1 sleeper x 0.014" in e.message
    # at the limit: 0.94 awake + 0.014 for the sleeper does not fit; 0.93 does
    tight = GROUP.replace("utilization = 0.9", "utilization = 0.94")
    assert any("over-committed" in d.message for d in check(tight))
    assert check(GROUP.replace("utilization = 0.9", "utilization = 0.93")) == []
    # a GPU of unknown memory counts a sleeper as 2 GiB of the smallest GPU vsup knows (80 GiB)
    unknown = NodeFacts.given(2)
    assert pytest.approx(SLEEPER_RESERVE_BYTES / (80 * GIB)) == SLEEPER_RESERVE_SHARE_UNKNOWN
    assert check(members(3), unknown) == []  # 0.9 + 2 x 0.025 = 0.95
    e = only([d for d in check(members(4), unknown) if d.instance == "a"], "over-committed")
    assert "3 sleepers x 0.025" in e.message and "adds up to 0.9" in e.message
    assert "by lowering gpu_memory_utilization" in e.message


def members(n: int, utilization: float = 0.9) -> str:
    """A swap group of `n` members on GPU 0."""
    text = '[defaults]\nmodel = "org/model"\nhost = "127.0.0.1"\n'
    for i in range(n):
        text += (
            f'\n[[instance]]\nname = "{"abcdefgh"[i]}"\ngpus = [0]\nport = {8000 + i}\n'
            f'gpu_memory_utilization = {utilization}\nswap_group = "g0"\nsleep = {{ level = 1 }}\n'
        )
    return text


def test_a_member_without_a_sleep_table_is_an_error_naming_the_table_to_add():
    text = edit(GROUP, "sleep = { level = 1 }\n", "")
    e = only(check(text), "has no sleep table")
    assert e.is_error and e.instance == "a" and e.key == "swap_group"
    assert e.file == "/tmp/swap.toml" and e.line == 13
    assert "sleep = { level = 1 }" in e.message and "swap group 'g0'" in e.message
    # and it counts in full: it cannot sleep
    assert any("over-committed" in d.message for d in check(text))
    none_say(check(GROUP), "has no sleep table")


def test_members_on_different_gpus_are_an_error():
    text = edit(GROUP, "gpus = [0]\nport = 8001", "gpus = [1]\nport = 8001")
    e = only(check(text), "take turns on the same GPUs")
    assert e.is_error and e.instance == "b" and e.key == "gpus"
    assert "'b' is on GPUs [1] but 'a' on [0]" in e.message and e.file == "/tmp/swap.toml"
    none_say(check(GROUP), "take turns on the same GPUs")
    # the same GPUs listed in another order are the same GPUs
    both = GROUP.replace("gpus = [0]", "gpus = [0, 1]", 1)
    both = both.replace("gpus = [0]", "gpus = [1, 0]", 1)
    none_say(check(both), "take turns on the same GPUs")


def test_a_group_of_one_is_a_warning():
    text = edit(
        GROUP, 'swap_group = "g0"\nsleep = { level = 1, after', "sleep = { level = 1, after"
    )
    w = only(check(text), "has this one member")
    assert not w.is_error and w.instance == "a" and w.key == "swap_group"
    assert "swap group 'g0'" in w.message
    none_say(check(GROUP), "has this one member")


def test_two_members_starting_awake_are_an_error():
    text = GROUP.replace("sleep = { level = 1", 'sleep = { start = "awake", level = 1')
    e = only(check(text), "one member of a group is awake at a time")
    assert e.is_error and e.instance == "b" and e.key == "sleep.start"
    assert "'a', 'b'" in e.message and 'start = "asleep"' in e.message
    one = GROUP.replace("sleep = { level = 1 }", 'sleep = { level = 1, start = "awake" }')
    one = one.replace("after_idle_s = 300", 'after_idle_s = 300, start = "asleep"')
    assert check(one) == []


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_sleep_on_loopback_is_fine(host):
    assert check(GROUP.replace('"127.0.0.1"', f'"{host}"')) == []


def test_sleep_on_the_default_host_is_an_error_unless_opted_in():
    text = GROUP.replace('host = "127.0.0.1"\n', "")  # the default host is 0.0.0.0
    errors = [d for d in check(text) if "dev mode" in d.message]
    assert [d.instance for d in errors] == ["a", "b"]
    e = errors[0]
    assert e.is_error and e.key == "host" and e.file == "/tmp/swap.toml"
    assert "host = '0.0.0.0'" in e.message and "/collective_rpc" in e.message
    assert 'host = "127.0.0.1"' in e.message and "router" in e.message
    assert "public_dev_mode = true" in e.message
    public = text.replace("sleep = { level = 1", "sleep = { public_dev_mode = true, level = 1")
    assert check(public) == []
    # an instance without sleep mode on 0.0.0.0 opens no dev endpoint
    plain = '[[instance]]\nname = "p"\nmodel = "org/m"\ngpus = [1]\nport = 8100\n'
    none_say(check(plain), "dev mode")


def test_an_address_of_another_interface_is_refused_too():
    text = GROUP.replace('"127.0.0.1"', '"10.1.2.3"')
    e = only(check(text), "dev mode")
    assert "host = '10.1.2.3'" in e.message and e.key == "host"


def test_sleep_on_a_cpu_instance_is_a_warning():
    text = (
        '[[instance]]\nname = "c"\nmodel = "org/m"\ngpus = []\nport = 8100\n'
        'host = "127.0.0.1"\nsleep = { level = 1 }\n'
    )
    w = only(check(text), "cannot sleep")
    assert not w.is_error and w.instance == "c" and w.key == "sleep"
    assert "sleep mode is not supported on CPU" in w.message
    none_say(check(GROUP), "cannot sleep")


@pytest.fixture
def old_vllm(tmp_path, monkeypatch) -> Iterator[str]:
    """A Python whose vLLM (0.5.0, an installed one: not vsup's frozen list) has no sleep mode:
    its flag list as vsup caches it after reading its parser."""
    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    vllm_flags._found.clear()
    root = tmp_path / "old"
    (root / "bin").mkdir(parents=True)
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "vllm-0.5.0.dist-info").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
    exe = root / "bin" / "python3"
    exe.write_text("#!/bin/sh\nexit 1\n")
    exe.chmod(0o755)
    found = vllm_flags.find_vllm(str(exe))
    assert found is not None and found.version == "0.5.0"
    cache = vllm_flags.cache_path(found)
    assert cache is not None
    cache.parent.mkdir(parents=True, exist_ok=True)
    flags = sorted(vllm_flags.frozen_flags().flags - {"enable-sleep-mode", "no-enable-sleep-mode"})
    cache.write_text(json.dumps({"flags": flags, "at": time.time()}))
    yield str(exe)
    vllm_flags._found.clear()


def test_a_known_vllm_without_sleep_mode_is_an_error(old_vllm):
    command = f'command = ["{old_vllm}", "-m", "vllm.entrypoints.openai.api_server"]\n'
    text = GROUP.replace('host = "127.0.0.1"\n', 'host = "127.0.0.1"\n' + command)
    errors = [d for d in check(text) if "--enable-sleep-mode" in d.message]
    assert [d.instance for d in errors] == ["a", "b"], [d.format() for d in errors]
    e = errors[0]
    assert e.is_error and e.instance == "a" and e.key == "sleep"
    assert "the installed vLLM 0.5.0 has no flag --enable-sleep-mode" in e.message
    # the same vLLM for instances that do not sleep: nothing to say
    plain = text.replace('swap_group = "g0"\n', "").replace("sleep = { level = 1 }\n", "")
    plain = plain.replace("sleep = { level = 1, after_idle_s = 300 }\n", "")
    plain = plain.replace("gpus = [0]\nport = 8001", "gpus = [1]\nport = 8001")
    none_say(check(plain), "--enable-sleep-mode")
    # vsup's own frozen list (vLLM 0.32) has it
    none_say(check(GROUP), "--enable-sleep-mode")


def test_the_flag_by_hand_without_a_sleep_table_is_a_warning():
    text = (
        '[[instance]]\nname = "h"\nmodel = "org/m"\ngpus = [1]\nport = 8100\n'
        "args = { enable-sleep-mode = true }\n"
    )
    w = only(check(text), "without a sleep table")
    assert not w.is_error and w.instance == "h" and w.key == "args.enable-sleep-mode"
    assert "sleep = { level = 1 }" in w.message and w.line == 6
    both = GROUP.replace(
        "sleep = { level = 1 }", "sleep = { level = 1 }\nargs = { enable-sleep-mode = true }"
    )
    none_say(check(both), "without a sleep table")


def test_level_2_with_idle_sleep_and_idle_sleep_without_a_router_are_fine():
    text = GROUP.replace("level = 1, after_idle_s = 300", "level = 2, after_idle_s = 60")
    assert check(text) == []
    solo = (
        '[[instance]]\nname = "s"\nmodel = "org/m"\ngpus = [1]\nport = 8100\n'
        'host = "127.0.0.1"\nsleep = { after_idle_s = 600 }\n'
    )
    assert check(solo) == []


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models") / "llama-8b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_8B))
    (d / "pytorch_model.bin").write_bytes(b"")  # weights: a config alone does not load
    return d


def sleepers(model: Path, level_b: int = 1) -> str:
    text = GROUP.replace('"org/model"', f'"{model}"')
    return text.replace("level = 1, after", f"level = {level_b}, after")


def test_level_1_sleepers_beyond_80_percent_of_host_ram_are_an_error(llama8b):
    need = 2 * LLAMA_8B_BYTES / GIB  # 29.9 GiB: both asleep at once
    errors = [d for d in check(sleepers(llama8b), node(host_gib=32)) if d.is_error]
    assert len(errors) == 1, [d.format() for d in errors]
    e = errors[0]
    assert e.instance == "a" and e.others == ("b",) and e.key == "sleep.level"
    assert e.file == "/tmp/swap.toml"
    each = f"{LLAMA_8B_BYTES / GIB:.1f} GiB"
    assert f"'a' {each}, 'b' {each} = {need:.1f} GiB" in e.message
    assert "of this node's 32.0 GiB" in e.message and "above 80%" in e.message
    assert "level 2" in e.message


def test_level_1_sleepers_above_half_the_host_ram_warn_and_below_pass(llama8b):
    (w,) = check(sleepers(llama8b), node(host_gib=48))
    assert not w.is_error and "above 50%" in w.message and "62%" in w.message
    assert check(sleepers(llama8b), node(host_gib=64)) == []
    # level 2 keeps nothing in host RAM: only 'a' counts (15 GiB of 24 GiB: a warning)
    (w,) = check(sleepers(llama8b, level_b=2), node(host_gib=24))
    assert not w.is_error and "'a'" in w.message and "'b'" not in w.message
    assert check(sleepers(llama8b, level_b=2), node(host_gib=32)) == []
    # unknown host RAM (--node-gpus): not checked
    assert check(sleepers(llama8b), NodeFacts.given(2)) == []


def test_vsup_validate_passes_a_swap_group_and_prints_it(write, capsys, llama8b):
    path = write(sleepers(llama8b))
    assert main(["validate", str(path), "--node-gpus", "2"]) == 0
    out, err = capsys.readouterr()
    assert f"{path}: valid (2 instances)" in out, err
    expected = (
        "  swap group g0: a, b time-share GPU 0 - one awake at a time, 0.90 of the GPU; sleepers "
        f"keep ~0.025 of the GPU each, level-1 weights {2 * LLAMA_8B_BYTES / GIB:.1f} GiB in "
        "host RAM"
    )
    assert expected in out
    assert main(["validate", str(path), "--node-gpus", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (group,) = doc["swap_groups"]
    assert group["name"] == "g0" and group["members"] == ["a", "b"] and group["gpus"] == [0]
    assert group["utilization"] == 0.9 and group["host_ram_bytes"] == 2 * LLAMA_8B_BYTES
    assert f"swap group {group['text']}" == expected.strip()
