"""The attention backend from every log format vLLM writes, else the flag, else the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from vsup.telemetry.backend import (
    BackendDetector,
    backend_from_line,
    label_for,
    normalize_flag,
    platform_from_line,
    resolve_backend,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
P = "(EngineCore pid=2243) INFO 11-29 22:17:33 "


@pytest.mark.parametrize(
    "line, name",
    [
        # CUDA 0.32, priority choice and --attention-backend
        (
            P + "[cuda.py:507] Using FLASH_ATTN attention backend out of potential backends: "
            "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].",
            "FLASH_ATTN",
        ),
        (
            P + "[cuda.py:507] Using FLASHINFER_MLA attention backend out of potential backends: "
            "['FLASHINFER_MLA', 'CUTLASS_MLA', 'FLASHMLA', 'TRITON_MLA'].",
            "FLASHINFER_MLA",
        ),
        (P + "[cuda.py:446] Using AttentionBackendEnum.FLASHINFER backend.", "FLASHINFER"),
        (P + "[cuda.py:446] Using AttentionBackendEnum.TRITON_ATTN backend.", "TRITON_ATTN"),
        # ROCm 0.32
        (
            P + "[rocm.py:850] Using TRITON_ATTN backend out of potential backends: "
            "['TRITON_ATTN', 'ROCM_ATTN'].",
            "TRITON_ATTN",
        ),
        (
            P + "[rocm.py:850] Using ROCM_AITER_FA backend out of potential backends: "
            "['ROCM_AITER_FA', 'TRITON_ATTN', 'ROCM_ATTN'].",
            "ROCM_AITER_FA",
        ),
        (
            P + "[rocm.py:750] Using ROCM_AITER_MLA backend (selected via --attention-backend).",
            "ROCM_AITER_MLA",
        ),
        (
            P + "[rocm.py:750] Using ROCM_ATTN backend (selected via --attention-backend).",
            "ROCM_ATTN",
        ),
        (
            P + "[rocm.py:840] Found incompatible backend(s) [ROCM_AITER_FA] with "
            "AttentionType.ENCODER_ONLY. Overriding with TRITON_ATTN out of potential backends: "
            "['TRITON_ATTN'].",
            "TRITON_ATTN",
        ),
        # ROCm, the AMD guide's era (and the same phrases without "on V1 engine")
        (P + "[rocm.py:231] Using Aiter Flash Attention backend on V1 engine.", "ROCM_AITER_FA"),
        (P + "[rocm.py:207] Using AITER MLA backend on V1 engine.", "ROCM_AITER_MLA"),
        (P + "[rocm.py:246] Using Triton Attention backend on V1 engine.", "TRITON_ATTN"),
        (P + "[rocm.py:241] Using Rocm Attention backend on V1 engine.", "ROCM_ATTN"),
        (
            P + "[rocm.py:225] Using Aiter Unified Attention backend on V1 engine.",
            "ROCM_AITER_UNIFIED_ATTN",
        ),
        (P + "[rocm.py:199] Using Triton MLA backend on V1 engine.", "TRITON_MLA"),
        (P + "[rocm.py:260] Using Aiter Flash Attention backend.", "ROCM_AITER_FA"),
        (P + "[rocm.py:262] Using AITER TRITON MLA backend.", "ROCM_AITER_TRITON_MLA"),
        (P + "[rocm.py:250] Using Triton MLA backend.", "TRITON_MLA"),
        (P + "[rocm.py:270] Using Rocm Attention backend.", "ROCM_ATTN"),
        # older CUDA
        (
            "INFO 03-19 11:13:26 [cuda.py:328] Using Flash Attention backend on V1 engine.",
            "FLASH_ATTN",
        ),
        ("INFO 03-19 11:13:26 [cuda.py:311] Using FlashInfer backend on V1 engine.", "FLASHINFER"),
        ("INFO 03-19 11:13:26 [cuda.py:311] Using FlashMLA backend on V1 engine.", "FLASHMLA"),
        (
            "INFO 03-19 11:13:26 [cuda.py:311] Using Cutlass MLA backend on V1 engine.",
            "CUTLASS_MLA",
        ),
        ("INFO 09-01 [selector.py:1] Using XFormers backend.", "XFORMERS"),
        # CPU MLA; XPU
        (P + "[cpu.py:175] Using CPU_MLA backend.", "CPU_MLA"),
        (P + "[cpu.py:163] Using AMX_MLA backend.", "AMX_MLA"),
        (P + "[xpu.py:192] Using Triton backend.", "TRITON_ATTN"),
        (P + "[xpu.py:189] Using Flash Attention MLA backend on XPU.", "FLASH_ATTN_MLA"),
        # colour codes around the line's end do not matter once stripped by the log watcher;
        # trailing blanks do not matter either
        (P + "[rocm.py:246] Using Triton Attention backend on V1 engine.   ", "TRITON_ATTN"),
    ],
)
def test_every_backend_line_format_names_the_backend(line: str, name: str) -> None:
    assert backend_from_line(line) == name


@pytest.mark.parametrize(
    "line",
    [
        P + "[rocm.py:886] Using AITER Flash Attention backend for ViT model.",
        P + "[rocm.py:908] Using Torch SDPA backend for ViT model.",
        P + "[cuda.py:547] Using backend AttentionBackendEnum.FLASH_ATTN for vit attention",
        P + "[interface.py:430] Using default backend AttentionBackendEnum.TORCH_SDPA for vit "
        "attention",
        P + "[fp8.py:1] Using TRITON Fp8 MoE backend out of potential backends: ['TRITON'].",
        P + "[mxfp4.py:1] Using 'FLASHINFER_CUTLASS' Mxfp4 MoE backend.",
        P + "[layer.py:1] Using FlashInfer fused KDA decode backend.",
        P + "[utils.py:347] Using LBHNC KV cache layout.",
        P + "[cpu.py:317] Reset SSM cache type to float32 for accelerated GDN mamba backend "
        "'none'.",
        P + "[flash_attn.py:1118] Using FlashAttention version 3",
        P + "[parallel_state.py:1906] world_size=1 rank=0 backend=gloo",
        P + "[eagle.py:1] Using the target model's FLASH_ATTN attention backend for the drafter.",
        P + "[core.py:1] Using Transformers modeling backend.",
        "",
    ],
)
def test_lines_about_other_backends_are_not_the_attention_backend(line: str) -> None:
    assert backend_from_line(line) is None


@pytest.mark.parametrize(
    "name, label",
    [
        ("ROCM_AITER_FA", "AITER MHA"),
        ("ROCM_AITER_MLA", "AITER MLA"),
        ("TRITON_ATTN", "Triton unified"),
        ("ROCM_ATTN", "ROCM_ATTN"),
        ("ROCM_AITER_UNIFIED_ATTN", "AITER Triton unified"),
        ("TRITON_MLA", "Triton MLA"),
        ("FLASH_ATTN", "FLASH_ATTN"),
        ("CPU_ATTN", "CPU_ATTN"),
    ],
)
def test_rocm_backends_show_the_names_the_amd_guides_use(name: str, label: str) -> None:
    assert label_for(name) == label


def test_the_log_beats_the_flag_beats_the_platform_default() -> None:
    from_log = resolve_backend("ROCM_AITER_FA", "TRITON_ATTN", "rocm", "line")
    assert (from_log.name, from_log.label, from_log.source, from_log.line) == (
        "ROCM_AITER_FA",
        "AITER MHA",
        "log",
        "line",
    )
    from_flag = resolve_backend(None, "rocm_aiter_mla", "rocm")
    assert (from_flag.name, from_flag.label, from_flag.source) == (
        "ROCM_AITER_MLA",
        "AITER MLA",
        "flag",
    )
    default = resolve_backend(None, None, "cpu")
    assert (default.name, default.source) == ("CPU_ATTN", "default")


def test_no_guess_on_a_gpu_when_neither_log_nor_flag_says() -> None:
    assert resolve_backend(None, None, "cuda") is None
    assert resolve_backend(None, None, "rocm") is None
    assert resolve_backend(None, None, None) is None


@pytest.mark.parametrize(
    "value, name",
    [
        ("FLASH_ATTN", "FLASH_ATTN"),
        ("flash_attn", "FLASH_ATTN"),
        ("rocm-aiter-fa", "ROCM_AITER_FA"),
        ("AttentionBackendEnum.TRITON_ATTN", "TRITON_ATTN"),
        ("", None),
        (None, None),
        (True, None),
    ],
)
def test_flag_values_are_normalised(value: object, name: str | None) -> None:
    assert normalize_flag(value) == name


def test_real_cpu_startup_log_says_nothing_so_the_cpu_default_is_reported() -> None:
    detector = BackendDetector()
    for line in (FIX / "startup.log").read_text().splitlines():
        detector.feed(line)
    assert detector.name is None
    assert detector.platform == "cpu"
    info = detector.result()
    assert (info.name, info.source) == ("CPU_ATTN", "default")
    flagged = detector.result(flag="CPU_ATTN")
    assert (flagged.name, flagged.source) == ("CPU_ATTN", "flag")


def test_cpu_build_that_ignored_a_requested_backend_reports_what_runs() -> None:
    detector = BackendDetector()
    detector.feed(P + "[core.py:133] Initializing a V1 LLM engine with config: device_config=cpu")
    detector.feed(P + "[cpu.py:179] Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU.")
    info = detector.result(flag="FLASH_ATTN")
    assert (info.name, info.source) == ("CPU_ATTN", "log")
    assert info.line is not None
    assert "Cannot use" in info.line


def test_first_announcement_wins_over_later_workers_and_rocm_beats_device_type_cuda() -> None:
    detector = BackendDetector()
    detector.feed(P + "[core.py:133] Initializing ... device_config=cuda, ...")
    assert detector.platform == "cuda"
    detector.feed(
        "(Worker_TP0 pid=1) INFO [rocm.py:850] Using ROCM_AITER_FA backend out of "
        "potential backends: ['ROCM_AITER_FA']."
    )
    detector.feed(
        "(Worker_TP1 pid=2) INFO [rocm.py:850] Using TRITON_ATTN backend out of "
        "potential backends: ['TRITON_ATTN']."
    )
    assert detector.platform == "rocm"
    assert detector.result().name == "ROCM_AITER_FA"


@pytest.mark.parametrize(
    "line, platform",
    [
        ("Initializing a V1 LLM engine (v0.32.0) with config: ..., device_config=cpu, ...", "cpu"),
        ("INFO [__init__.py:1] Automatically detected platform cuda.", "cuda"),
        ("INFO [__init__.py:1] Automatically detected platform rocm.", "rocm"),
        ("WARNING 11-29 22:17:26 [cpu.py:224] Triton is not installed.", "cpu"),
        ("INFO [rocm.py:1] something", "rocm"),
        ("plain text", None),
    ],
)
def test_platform_from_log_lines(line: str, platform: str | None) -> None:
    assert platform_from_line(line) == platform
