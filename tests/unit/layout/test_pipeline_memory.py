"""Pipeline parallel in the memory estimate (issue 40): each GPU holds only its stage's layers,
so its share of the weights and its KV bytes per token are those of its stage, the fullest
stage (vLLM's split, vllm/distributed/utils.py `get_pp_indices`) deciding; on one node and in a
span of `nodes` (TP x PP over several nodes, docs/fleet.md "One group across nodes")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vsup.layout.budget import stage_weight_bytes
from vsup.layout.kvcache import kv_layout
from vsup.layout.model import load_layout
from vsup.layout.parallel import pp_stage_layers, read_pp_partition
from vsup.layout.validate import validate

from tests.unit.layout.test_validate import MLA_CONFIG

GIB = 2**30

# Llama-3-70B's shape: 80 layers, 8 KV heads, untied 128256 x 8192 embedding and LM head
LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# DeepSeek-V3's shape (61 layers, MLA), as bf16: ~1.3 TB of weights
DEEPSEEK_V3 = MLA_CONFIG
CMD = '["python", "-m", "vllm.entrypoints.openai.api_server"]'


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, cfg in (("llama70b", LLAMA_70B), ("dsv3", DEEPSEEK_V3)):
        d = tmp_path / "models" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "pytorch_model.bin").write_bytes(b"")
        out[name] = str(d)
    return out


def instance(name: str, gpus: int, first: int, args: str, extra: str = "") -> str:
    listed = ", ".join(str(g) for g in range(first, first + gpus))
    return (
        f'[[instance]]\nname = "{name}"\ngpus = [{listed}]\nport = {8000 + first}\n'
        f"gpu_memory_utilization = 0.9\nargs = {{ {args} }}\n{extra}"
    )


def diagnostics_of(tmp_path: Path, model: str, *instances: str, node_gpus: int = 8, gib=80):
    path = tmp_path / "l.toml"
    path.write_text(
        f'[layout]\nname = "t"\n\n[defaults]\nmodel = "{model}"\ncommand = {CMD}\n\n'
        + "\n".join(instances)
    )
    return validate(load_layout(path), node_gpus=node_gpus, gpu_memory_bytes=gib * GIB)


def kv_tokens(diagnostics, name: str) -> int:
    """The KV capacity the concurrency warning of instance `name` states."""
    for d in diagnostics:
        found = re.search(r"beyond the KV cache's (\d+) ", d.message)
        if d.instance == name and found:
            return int(found.group(1))
    raise AssertionError([d.format() for d in diagnostics])


def refusals(diagnostics, name: str) -> list[str]:
    return [d.message for d in diagnostics if d.instance == name and "refuse" in d.message]


# -- vLLM's split of the layers --------------------------------------------------------------


def test_stages_split_as_vllm_does():
    assert pp_stage_layers(80, 2) == (40, 40)
    # the remainder: one more each on the stages before the last, from the second-to-last
    assert pp_stage_layers(61, 4) == (15, 15, 16, 15)
    assert pp_stage_layers(62, 4) == (15, 16, 16, 15)
    assert pp_stage_layers(63, 4) == (16, 16, 16, 15)
    assert pp_stage_layers(61, 2) == (31, 30)
    assert pp_stage_layers(7, 1) == (7,)
    # VLLM_PP_LAYER_PARTITION, when vLLM would take it; otherwise vLLM refuses to start and
    # the estimate keeps the default split
    assert pp_stage_layers(61, 4, read_pp_partition("10,20,20,11")) == (10, 20, 20, 11)
    assert pp_stage_layers(61, 4, read_pp_partition("10,20,20")) == (15, 15, 16, 15)
    assert read_pp_partition("a,b") is None and read_pp_partition(None) is None


# -- one GPU's KV bytes per token and weights ------------------------------------------------


def test_kv_bytes_per_token_are_the_fullest_stages():
    whole = kv_layout(LLAMA_70B, width=2, tp=2)
    half = kv_layout(LLAMA_70B, width=2, tp=2, pp=2)
    assert whole is not None and half is not None
    assert whole.bytes_per_token == 80 * 4 * 128 * 2 * 2
    assert half.stages == (40, 40)
    assert half.bytes_per_token == whole.bytes_per_token // 2
    # uneven: 61 MLA layers over 4 stages, the 16-layer stage decides
    dsv3 = kv_layout(DEEPSEEK_V3, width=2, pp=4)
    assert dsv3 is not None and dsv3.stages == (15, 15, 16, 15)
    assert dsv3.bytes_per_token == 16 * (512 + 64) * 2
    # groups span the stages as vLLM strides them: every stage holds a share of each group
    gemma3 = {
        "model_type": "gemma3_text",
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "num_hidden_layers": 48,
        "sliding_window": 512,
    }
    one, two = kv_layout(gemma3, width=2), kv_layout(gemma3, width=2, pp=2)
    assert one is not None and two is not None
    assert two.bytes_per_token * 2 == one.bytes_per_token
    assert two.groups == one.groups  # blocks per request: the whole model's groups


def test_every_stage_gets_the_fewest_blocks():
    kv = kv_layout(LLAMA_70B, width=2, pp=2)
    assert kv is not None
    per_block = kv.bytes_per_token * 16
    assert kv.blocks([10 * per_block, 7 * per_block], 16) == 7
    assert kv.blocks(10 * per_block, 16) == 10


def test_stage_weights_carry_the_embedding_and_the_lm_head():
    # 80 layers of 1 GiB each, embedding and LM head of 2 GiB each
    weights = 80 * GIB + 2 * 2 * GIB
    assert stage_weight_bytes(weights, (80,), 2 * GIB, 2) == [weights]
    assert stage_weight_bytes(weights, (40, 40), 2 * GIB, 2) == [42 * GIB, 42 * GIB]
    # tied: the last stage builds its own LM head all the same
    tied = 80 * GIB + 2 * GIB
    assert stage_weight_bytes(tied, (40, 40), 2 * GIB, 1) == [42 * GIB, 42 * GIB]
    assert stage_weight_bytes(weights, (20, 20, 21, 19), 2 * GIB, 2) == [
        22 * GIB,
        20 * GIB,
        21 * GIB,
        21 * GIB,
    ]
    # vocabulary unknown: the weights split by layers
    assert stage_weight_bytes(80 * GIB, (40, 40)) == [40 * GIB, 40 * GIB]


# -- validation's estimate -------------------------------------------------------------------


def test_tp2_x_pp2_holds_what_tp4_holds(tmp_path, models):
    """On four GPUs, TP2 x PP2 gives each GPU a quarter of the weights and of the KV heads x
    layers, as TP4 does (untied embeddings: the same bytes on each GPU). Before, the estimate
    divided the weights by TP only: a 70B at TP2 x PP2 on 80 GiB GPUs 'would likely refuse to
    start'."""
    seqs = "max-model-len = 131072, max-num-seqs = 64"
    found = diagnostics_of(
        tmp_path,
        models["llama70b"],
        instance("tp4", 4, 0, f"tensor-parallel-size = 4, {seqs}"),
        instance("pp", 4, 4, f"tensor-parallel-size = 2, pipeline-parallel-size = 2, {seqs}"),
    )
    assert not [d.format() for d in found if d.is_error]
    assert not refusals(found, "pp")
    tp4, pp = kv_tokens(found, "tp4"), kv_tokens(found, "pp")
    assert tp4 > 400_000
    assert abs(pp - tp4) <= tp4 * 0.001, (pp, tp4)
    message = next(d.message for d in found if d.instance == "pp" and "beyond" in d.message)
    assert "2 pipeline stages of 40/40 layers" in message


def test_pp_with_data_parallel_divides_nothing_more(tmp_path, models):
    """DP ranks each hold a whole copy: TP2 x PP2 x DP2 on 8 GPUs is, per GPU, TP2 x PP2."""
    seqs = "max-model-len = 131072, max-num-seqs = 64"
    pp = f"tensor-parallel-size = 2, pipeline-parallel-size = 2, {seqs}"
    alone = diagnostics_of(tmp_path, models["llama70b"], instance("pp", 4, 0, pp))
    dp = diagnostics_of(
        tmp_path, models["llama70b"], instance("pp", 8, 0, f"{pp}, data-parallel-size = 2")
    )
    assert not [d.format() for d in dp if d.is_error]
    assert kv_tokens(dp, "pp") == kv_tokens(alone, "pp")


def test_tp2_alone_is_still_too_small(tmp_path, models):
    found = diagnostics_of(
        tmp_path,
        models["llama70b"],
        instance("tp2", 2, 0, "tensor-parallel-size = 2, max-model-len = 131072"),
    )
    assert refusals(found, "tp2")


def test_partition_env_moves_the_fullest_stage(tmp_path, models):
    """VLLM_PP_LAYER_PARTITION = "20,60": the 60-layer stage decides (fewer tokens)."""
    seqs = "max-model-len = 131072, max-num-seqs = 64"
    args = f"tensor-parallel-size = 2, pipeline-parallel-size = 2, {seqs}"
    even = kv_tokens(diagnostics_of(tmp_path, models["llama70b"], instance("pp", 4, 0, args)), "pp")
    skewed = diagnostics_of(
        tmp_path,
        models["llama70b"],
        instance("pp", 4, 0, args, 'env = { VLLM_PP_LAYER_PARTITION = "20,60" }\n'),
    )
    assert refusals(skewed, "pp") or kv_tokens(skewed, "pp") < even


# -- a span of nodes: TP x PP across them ----------------------------------------------------


def span_layout(tmp_path: Path, model: str, args: str, gpus: int = 8) -> Path:
    path = tmp_path / "span.toml"
    listed = ", ".join(str(g) for g in range(gpus))
    path.write_text(
        f'[layout]\nname = "spanned"\n\n[[instance]]\nname = "big"\nmodel = "{model}"\n'
        f"command = {CMD}\ngpus = [{listed}]\nport = 8000\ngpu_memory_utilization = 0.9\n"
        f"args = {{ {args} }}\n"
        'span = { nodes = ["gpu01", "gpu02"], address = "10.0.0.1" }\n'
    )
    return path


@pytest.mark.parametrize(
    "args",
    [
        "",  # TP = len(gpus), PP = len(nodes)
        "pipeline-parallel-size = 2, ",  # TP = 16 / 2, not 8 / 2
        "tensor-parallel-size = 8, pipeline-parallel-size = 2, ",
    ],
)
def test_span_of_nodes_holds_what_one_node_of_16_would(tmp_path, models, args):
    """DeepSeek-V3 in bf16 over two nodes of eight 141 GiB GPUs, TP8 x PP2: each GPU holds
    ~1/16 of it. Before, the estimate took TP8 without the stages (twice the weights a GPU
    holds: no KV cache at all)."""
    seqs = "max-model-len = 163840, max-num-seqs = 256"
    span = validate(
        load_layout(span_layout(tmp_path, models["dsv3"], args + seqs)),
        node_gpus=8,
        gpu_memory_bytes=141 * GIB,
    )
    assert not [d.format() for d in span if d.is_error]
    assert not refusals(span, "big")
    one_node = diagnostics_of(
        tmp_path,
        models["dsv3"],
        instance("big", 16, 0, f"tensor-parallel-size = 8, pipeline-parallel-size = 2, {seqs}"),
        node_gpus=16,
        gib=141,
    )
    assert kv_tokens(span, "big") == kv_tokens(one_node, "big") > 163840


# -- VLLM_PP_LAYER_PARTITION that vLLM refuses -----------------------------------------------


@pytest.mark.parametrize(
    ("value", "pp", "words"),
    [
        ("40,x", 2, "is not comma-separated integers"),
        ("20,20,40", 2, "gives 3 stage(s) but the instance runs 2 pipeline stage(s)"),
        ("40,41", 2, "sums to 81 layers but the model has 80"),
        ("80", 1, None),
        ("30,50", 2, None),
    ],
)
def test_a_partition_vllm_refuses_is_an_error(tmp_path, models, value, pp, words):
    found = diagnostics_of(
        tmp_path,
        models["llama70b"],
        instance(
            "pp",
            2 * pp,
            0,
            f"tensor-parallel-size = 2, pipeline-parallel-size = {pp}",
            f'env = {{ VLLM_PP_LAYER_PARTITION = "{value}" }}\n',
        ),
    )
    errors = [d for d in found if d.is_error and d.key == "env.VLLM_PP_LAYER_PARTITION"]
    if words is None:
        assert not errors, [d.format() for d in errors]
        return
    (e,) = errors
    assert words in e.message and "vLLM refuses to start" in e.message
    assert (e.file, e.instance, e.line) == (str(tmp_path / "l.toml"), "pp", 14)  # the env line


def test_a_partition_over_a_span_of_nodes_counts_its_stages(tmp_path, models):
    """PP = len(nodes) when args leave it out: a partition of 2 stages is right there."""
    path = span_layout(tmp_path, models["dsv3"], "")
    text = path.read_text().replace("span =", 'env = { VLLM_PP_LAYER_PARTITION = "31,30" }\nspan =')
    path.write_text(text)
    found = validate(load_layout(path), node_gpus=8, gpu_memory_bytes=141 * GIB)
    assert not [d.format() for d in found if d.is_error]
    path.write_text(text.replace('"31,30"', '"20,20,21"'))
    found = validate(load_layout(path), node_gpus=8, gpu_memory_bytes=141 * GIB)
    (e,) = [d for d in found if d.is_error]
    assert e.key == "env.VLLM_PP_LAYER_PARTITION" and "runs 2 pipeline stage(s)" in e.message


def test_a_span_of_data_parallel_ranks_with_pp(tmp_path, models):
    """`ranks`: each rank a whole TP x PP copy; a GPU holds what TP2 x PP2 alone holds."""
    seqs = "max-model-len = 131072, max-num-seqs = 64"
    pp = f"tensor-parallel-size = 2, pipeline-parallel-size = 2, {seqs}"
    alone = diagnostics_of(tmp_path, models["llama70b"], instance("pp", 4, 0, pp))
    path = tmp_path / "ranks.toml"
    path.write_text(
        f'[layout]\nname = "spanned"\n\n[[instance]]\nname = "pp"\nmodel = "{models["llama70b"]}"\n'
        f"command = {CMD}\ngpus = [0, 1, 2, 3, 4, 5, 6, 7]\nport = 8000\n"
        f"gpu_memory_utilization = 0.9\nargs = {{ {pp} }}\n"
        'span = { ranks = { gpu01 = 2, gpu02 = 2 }, address = "10.0.0.1" }\n'
    )
    found = validate(load_layout(path), node_gpus=8, gpu_memory_bytes=80 * GIB)
    assert not [d.format() for d in found if d.is_error]
    assert kv_tokens(found, "pp") == kv_tokens(alone, "pp")
