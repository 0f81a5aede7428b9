"""The KV cache a model needs, layer by layer, sized the way vLLM's KV cache manager sizes it.

vLLM (0.32: vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py) gives each
attention layer a spec: full attention, sliding window (with its window), chunked local, MLA;
linear-attention / mamba layers hold a fixed state per sequence instead of per-token KV. It then
groups the layers:

- every layer of one type: one group with all of them (a block holds `block_size` tokens of every
  layer);
- several types (gpt-oss, Gemma 2/3, Llama 4): groups of equal size, the size being the fewest
  layers of any type (the most, when that is under 1.5 x the fewest); a type's layers are split
  over `ceil(n / size)` groups, padded. All groups draw blocks from one pool; a pool block is one
  page of `size` layers.

So a pool block costs `size x page` bytes, and one request of L tokens takes, per group,
`ceil(L / block)` blocks (full, MLA) or `ceil(min(window - 1 + in_flight, L) / block) + 1`
(sliding window; `in_flight`: max-num-batched-tokens per concurrent batch, `in_flight_tokens`).
vLLM logs `KV cache size: N tokens` with N = blocks / (blocks per request of max-model-len) x
max-model-len, so for windowed models N exceeds the bytes / bytes-per-token of full attention.

`KVLayout.bytes_per_token` is the pool's bytes per token slot (what a token of a full-attention
group costs); `tokens(kv_bytes, ...)` is the figure vLLM logs.

Pipeline parallel (`pp` stages): each stage's GPUs hold only its layers' KV (vLLM splits the
layers as `vsup.layout.parallel.pp_stage_layers` says). vLLM (get_kv_cache_configs) forms the
groups from the whole model (a type's layers go to its groups strided, `layers[i::n]`, so every
stage holds a share of each group), gives each stage's pool block the bytes of its own layers of
the widest group, and then gives every stage the fewest blocks any stage can afford. So
`stage_bytes` holds each stage's bytes per token slot, `bytes_per_token` the largest (the stage
with the most layers), and `tokens` takes the KV bytes of each stage's GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vsup.layout.parallel import pp_stage_layers

FULL = "full"
SLIDING = "sliding"  # sliding window, and Llama 4's chunked local attention
MLA = "mla"
LINEAR = "linear"  # mamba / linear attention: a fixed state per sequence

# The default block sizes: vLLM's CacheConfig (16 on GPUs) and the CPU build (128).
GPU_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
# max-num-batched-tokens of `vllm serve` when args do not set it (arg_utils: 8192 on >= 70 GiB
# GPUs like the H200 and MI300X, 2048 on the CPU build per CPU socket)
DEFAULT_BATCHED_TOKENS_GPU = 8192
DEFAULT_BATCHED_TOKENS_CPU = 2048


def in_flight_tokens(batched_tokens: int, gpu: bool, pp: int = 1) -> int:
    """Tokens scheduled but not yet freed (vLLM's `max_in_flight_tokens`): one batch per
    concurrent step. GPUs schedule asynchronously (2 batches at once; PP stages otherwise), the
    CPU build does not. Seen on the H200 with vLLM 0.26: a 1024-window model held
    1023 + 2 x 8192 tokens per request."""
    batches = (2 if pp <= 1 else pp) if gpu else max(1, pp)
    return batches * batched_tokens


@dataclass(frozen=True)
class LayerSpec:
    kind: str  # FULL | SLIDING | MLA | LINEAR
    bytes_per_token: int  # per GPU of one TP rank; 0 for LINEAR
    window: int | None = None  # SLIDING
    state_bytes: int = 0  # LINEAR: per sequence


@dataclass(frozen=True)
class KVGroup:
    kind: str
    layers: int  # real layers in the group (padding not counted)
    size: int  # the group size (layers per group, padded)
    page_bytes_per_token: int  # one layer of the group
    window: int | None = None


@dataclass(frozen=True)
class KVLayout:
    layers: tuple[LayerSpec, ...]
    groups: tuple[KVGroup, ...]
    width: int  # bytes per element of the cache
    notes: tuple[str, ...] = ()
    # pipeline parallel: the layers of each stage and the bytes of one token slot of its pool;
    # empty without PP (see the module docstring)
    stages: tuple[int, ...] = ()
    stage_bytes: tuple[int, ...] = ()

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token slot of the pool: `size` layers of the widest page; with PP, the
        largest stage's (the one that runs out first on equal memory)."""
        if not self.groups:
            return 0
        if self.stage_bytes:
            return max(self.stage_bytes)
        return max(g.size * g.page_bytes_per_token for g in self.groups)

    @property
    def naive_bytes_per_token(self) -> int:
        """Every attention layer holding every token (what a per-layer sum gives)."""
        return sum(layer.bytes_per_token for layer in self.layers)

    @property
    def state_bytes_per_sequence(self) -> int:
        return sum(layer.state_bytes for layer in self.layers)

    @property
    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer in self.layers:
            out[layer.kind] = out.get(layer.kind, 0) + 1
        return out

    def blocks_per_request(self, max_len: int, block_size: int, in_flight: int) -> int:
        total = 0
        for g in self.groups:
            if g.kind == SLIDING and g.window:
                held = min(g.window - 1 + in_flight, max_len)
                total += math.ceil(held / block_size) + 1
            else:
                total += math.ceil(max_len / block_size)
        return total

    def blocks(self, kv_bytes: float | Sequence[float], block_size: int) -> int:
        """Pool blocks for `kv_bytes` of KV cache on one GPU; with PP, `kv_bytes` may give each
        stage's GPU its own (its weights differ): the fewest blocks of any stage, as vLLM
        gives every stage."""
        if not self.groups:
            return 0
        per_stage = self.stage_bytes or (self.bytes_per_token,)
        if isinstance(kv_bytes, (int, float)):
            kv_bytes = [kv_bytes] * len(per_stage)
        if len(kv_bytes) != len(per_stage):
            raise ValueError(f"{len(kv_bytes)} KV sizes for {len(per_stage)} pipeline stages")
        counts = [
            int(kv // (b * block_size)) for kv, b in zip(kv_bytes, per_stage, strict=True) if b > 0
        ]
        return max(0, min(counts)) if counts else 0

    def tokens(
        self, kv_bytes: float | Sequence[float], max_len: int, block_size: int, in_flight: int
    ) -> int:
        """The `KV cache size: N tokens` vLLM logs for `kv_bytes` of KV cache on one GPU (one
        figure, or one per PP stage: `blocks`)."""
        blocks = self.blocks(kv_bytes, block_size)
        if blocks <= 0:
            return 0
        per_request = self.blocks_per_request(max_len, block_size, in_flight)
        if per_request <= 0:
            return 0
        return int(blocks / per_request * max_len)

    def describe(self) -> str:
        kinds = self.kinds
        parts = []
        for kind in (FULL, SLIDING, MLA, LINEAR):
            if kind in kinds:
                label = {FULL: "full", SLIDING: "sliding", MLA: "MLA", LINEAR: "linear"}[kind]
                if kind == SLIDING:
                    windows = sorted({layer.window for layer in self.layers if layer.window})
                    label += f" (window {'/'.join(map(str, windows))})"
                parts.append(f"{kinds[kind]} {label}")
        return " + ".join(parts) + " layers"


def _num(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def layer_kinds(cfg: Mapping[str, Any], layers: int) -> list[tuple[str, int | None]] | None:
    """(kind, window) per layer from a (text) config; None when the config says too little."""
    window = _num(cfg, "sliding_window", "attention_chunk_size")
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(types, Sequence) and not isinstance(types, str) and len(types) >= layers:
        out: list[tuple[str, int | None]] = []
        for t in list(types)[:layers]:
            t = str(t).lower()
            if "linear" in t or "mamba" in t or "ssm" in t or "conv" in t:
                out.append((LINEAR, None))
            elif ("sliding" in t or "local" in t or "chunk" in t) and window:
                out.append((SLIDING, window))
            else:
                out.append((FULL, None))
        return out
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: "M-M*-..."
    if isinstance(pattern, str) and len(pattern) >= layers:
        kinds: list[tuple[str, int | None]] = []
        for ch in pattern[:layers]:
            if ch == "*":
                kinds.append((FULL, None))
            elif ch == "M":
                kinds.append((LINEAR, None))
        return kinds
    interval = _num(cfg, "full_attention_interval")  # Qwen3-Next: every Nth layer full
    if interval and str(cfg.get("model_type", "")).startswith("qwen3_next"):
        return [(FULL, None) if (i + 1) % interval == 0 else (LINEAR, None) for i in range(layers)]
    model_type = str(cfg.get("model_type", "")).lower()
    sw = _num(cfg, "sliding_window")
    if sw and cfg.get("use_sliding_window") is not False:
        pattern_n = _num(cfg, "sliding_window_pattern")
        if model_type.startswith("gemma3") or pattern_n:
            n = pattern_n or 6  # Gemma 3: five local layers, then a global one
            return [(FULL, None) if (i + 1) % n == 0 else (SLIDING, sw) for i in range(layers)]
        if model_type.startswith(("gemma2", "cohere2")):
            return [(SLIDING, sw) if i % 2 == 0 else (FULL, None) for i in range(layers)]
        return [(SLIDING, sw)] * layers  # Mistral-style: every layer windowed
    chunk = _num(cfg, "attention_chunk_size")
    if chunk and isinstance(cfg.get("no_rope_layers"), Sequence):
        # Llama 4: RoPE layers attend within chunks, NoPE layers globally
        nope = list(cfg["no_rope_layers"])
        return [
            (SLIDING, chunk) if i < len(nope) and nope[i] else (FULL, None) for i in range(layers)
        ]
    return [(FULL, None)] * layers


def _per_layer_kv_heads(cfg: Mapping[str, Any], layers: int) -> list[int] | None:
    kv = cfg.get("num_key_value_heads", cfg.get("num_kv_heads"))
    if isinstance(kv, Sequence) and not isinstance(kv, str) and len(kv) >= layers:
        return [int(x) for x in list(kv)[:layers]]
    if cfg.get("multi_query") is True:
        return [1] * layers
    n = _num(cfg, "num_key_value_heads", "n_head_kv", "num_kv_heads")
    n = n or _num(cfg, "num_attention_heads", "n_head", "num_heads")
    return [n] * layers if n else None


def _linear_state_bytes(cfg: Mapping[str, Any], tp: int, width: int) -> int:
    """A linear-attention layer's fixed state per sequence (Qwen3-Next gated delta net)."""
    nv = _num(cfg, "linear_num_value_heads")
    nk = _num(cfg, "linear_num_key_heads") or nv
    dk = _num(cfg, "linear_key_head_dim")
    dv = _num(cfg, "linear_value_head_dim")
    kernel = _num(cfg, "linear_conv_kernel_dim") or 4
    if nv and nk and dk and dv:
        ssm = (nv // max(1, tp)) * dk * dv
        conv = (2 * nk * dk + nv * dv) // max(1, tp) * (kernel - 1)
        return (ssm + conv) * width
    heads = _num(cfg, "mamba_n_heads", "mamba_num_heads")
    head_dim = _num(cfg, "mamba_head_dim")
    state = _num(cfg, "ssm_state_size", "mamba_d_state", "state_size")
    if heads and head_dim and state:
        return (heads // max(1, tp)) * head_dim * state * width
    return 0


def _layer_positions(cfg: Mapping[str, Any], layers: int, n: int) -> list[int]:
    """Each of the `n` layers `layer_kinds` gave: its index among the model's `layers` (what PP
    stages split). Nemotron-H's pattern also counts its MLP layers ('-', 'E'), which hold no
    cache; otherwise the kinds are the layers."""
    pattern = cfg.get("hybrid_override_pattern")
    if n != layers and isinstance(pattern, str):
        at = [i for i, ch in enumerate(pattern[:layers]) if ch in "*M"]
        if len(at) == n:
            return at
    return [i * layers // max(1, n) for i in range(n)] if n != layers else list(range(n))


def kv_layout(
    cfg: Mapping[str, Any],
    *,
    width: int,
    tp: int = 1,
    hybrid_manager: bool = True,
    pp: int = 1,
    partition: tuple[int, ...] | None = None,
) -> KVLayout | None:
    """The KV cache layout of a (text) config on one GPU of a TP-`tp` x PP-`pp` instance,
    `width` bytes per cached element; None when the config lacks layers, heads or head size.

    `hybrid_manager=False` is `--disable-hybrid-kv-cache-manager`: every attention layer then
    holds full-length KV. `partition`: VLLM_PP_LAYER_PARTITION (parallel.read_pp_partition)."""
    layers = _num(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if not layers:
        return None
    kinds = layer_kinds(cfg, layers)
    if not kinds:
        return None
    positions = _layer_positions(cfg, layers, len(kinds))
    notes: list[str] = []
    kv_lora = _num(cfg, "kv_lora_rank")
    specs: list[LayerSpec] = []
    if kv_lora:
        # MLA keeps one latent (+ the RoPE key) per token and layer, the same on every TP rank.
        rope = _num(cfg, "qk_rope_head_dim") or 0
        per = (kv_lora + rope) * width
        specs = [LayerSpec(MLA, per) for kind, _ in kinds if kind != LINEAR]
        positions = [at for at, (kind, _) in zip(positions, kinds, strict=True) if kind != LINEAR]
    else:
        heads = _per_layer_kv_heads(cfg, layers)
        hidden = _num(cfg, "hidden_size", "n_embd", "d_model")
        q_heads = _num(cfg, "num_attention_heads", "n_head", "num_heads")
        head_dim = _num(cfg, "head_dim") or (hidden // q_heads if hidden and q_heads else None)
        if not heads or not head_dim:
            return None
        state = _linear_state_bytes(cfg, tp, width)
        for (kind, window), kv_heads in zip(kinds, heads, strict=False):
            if kind == LINEAR:
                specs.append(LayerSpec(LINEAR, 0, state_bytes=state))
                continue
            # KV heads split over TP ranks; with fewer heads than ranks each rank keeps one.
            per_rank = max(1, kv_heads // max(1, tp))
            per = per_rank * head_dim * 2 * width
            if not hybrid_manager and kind == SLIDING:
                kind, window = FULL, None
            specs.append(LayerSpec(kind, per, window))
        if any(s.kind == LINEAR for s in specs) and not state:
            notes.append("linear-attention state per sequence unknown for this config")
    placed = [(s, at) for s, at in zip(specs, positions, strict=False) if s.kind != LINEAR]
    attention = [s for s, _ in placed]
    if not attention:
        return KVLayout(tuple(specs), (), width, tuple(notes))
    groups = _groups(attention)
    if pp <= 1:
        return KVLayout(tuple(specs), groups, width, tuple(notes))
    stages = pp_stage_layers(layers, pp, partition)
    return KVLayout(tuple(specs), groups, width, tuple(notes), stages, _stage_bytes(placed, stages))


def _type_members(attention: Sequence[LayerSpec]) -> tuple[int, list[list[int]]]:
    """vLLM's grouping (kv_cache_utils, several layer types): (the group size, each group's
    layers as indices into `attention`). A type's layers go to its ceil(n / size) groups
    strided, `layers[i::n_groups]`; one type: one group of all of them."""
    by_type: dict[tuple[str, int | None], list[int]] = {}
    for i, s in enumerate(attention):
        by_type.setdefault((s.kind, s.window), []).append(i)
    if len(by_type) == 1:
        return 1, list(by_type.values())
    counts = [len(v) for v in by_type.values()]
    size = min(counts)
    if max(counts) < size * 1.5:
        size = max(counts)
    out: list[list[int]] = []
    for members in by_type.values():
        n_groups = math.ceil(len(members) / size)
        out.extend(members[i::n_groups] for i in range(n_groups))
    return size, out


def _groups(attention: list[LayerSpec]) -> tuple[KVGroup, ...]:
    size, members = _type_members(attention)
    if len(members) == 1:
        (layers,) = members
        first = attention[layers[0]]
        # one group; layers may differ in size (per-layer KV heads): their pages add up
        total = sum(attention[i].bytes_per_token for i in layers)
        return (KVGroup(first.kind, len(layers), 1, total, first.window),)
    page: dict[tuple[str, int | None], int] = {}
    for s in attention:
        key = (s.kind, s.window)
        page[key] = max(page.get(key, 0), s.bytes_per_token)
    out = []
    for layers in members:
        first = attention[layers[0]]
        key = (first.kind, first.window)
        out.append(KVGroup(first.kind, len(layers), size, page[key], first.window))
    return tuple(out)


def _stage_bytes(placed: Sequence[tuple[LayerSpec, int]], stages: Sequence[int]) -> tuple[int, ...]:
    """Each PP stage's bytes per token slot: its own layers of each (whole-model) group, the
    widest group's (vLLM's per-worker block, `_get_kv_cache_bytes_per_block`)."""
    _, members = _type_members([s for s, _ in placed])
    out: list[int] = []
    start = 0
    for count in stages:
        end = start + count
        out.append(
            max(
                sum(placed[i][0].bytes_per_token for i in group if start <= placed[i][1] < end)
                for group in members
            )
        )
        start = end
    return tuple(out)
