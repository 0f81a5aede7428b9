"""Which attention backend a vLLM server really runs, and where vsup learnt it.

Only the start-up log says which backend was chosen. The lines differ by platform and version
(vllm/platforms/cuda.py, rocm.py, cpu.py, xpu.py; names from
vllm/v1/attention/backends/registry.py `AttentionBackendEnum`):

- CUDA 0.32, chosen by priority: `Using FLASH_ATTN attention backend out of potential backends:
  ['FLASH_ATTN', 'FLASHINFER', ...].`
- CUDA 0.32, chosen with `--attention-backend`: `Using AttentionBackendEnum.FLASHINFER backend.`
- ROCm 0.32: `Using TRITON_ATTN backend out of potential backends: [...]`,
  `Using ROCM_AITER_FA backend (selected via --attention-backend).`, and when some layer
  rejected a backend `Found incompatible backend(s) [...] with ... Overriding with X out of
  potential backends: [...]`.
- CPU 0.32: `Using CPU_MLA backend.` / `Using AMX_MLA backend.` for MLA models; nothing at all
  for the default `CPU_ATTN`, and `Cannot use X backend on CPU.` when a flag asked for another.
- Older releases wrote phrases: `Using Aiter Flash Attention backend on V1 engine.`,
  `Using AITER MLA backend on V1 engine.`, `Using Triton Attention backend on V1 engine.`,
  `Using Rocm Attention backend on V1 engine.`, `Using Aiter Unified Attention backend on V1
  engine.`, `Using Triton MLA backend on V1 engine.`, `Using Flash Attention backend on V1
  engine.`, `Using FlashInfer backend on V1 engine.`; some releases dropped ` on V1 engine`.
- Lines about ViT (vision encoder) attention are not the model's backend and are skipped.

When the log has not said (yet), the configured `--attention-backend` is reported (source
"flag"); failing that the platform default where there is exactly one (CPU: `CPU_ATTN`,
source "default"). On a GPU without a log line the answer is None: the choice there depends on
the GPU, the model and environment variables, and a guess is not a measurement.

The raw enum name is kept (`BackendInfo.name`); `label` is the name the AMD tuning guides use
(AITER MHA, AITER MLA, Triton unified, ROCM_ATTN, ...), the enum name otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Names the AMD guides and their log lines use, by enum name.
LABELS = {
    "ROCM_AITER_FA": "AITER MHA",
    "ROCM_AITER_MLA": "AITER MLA",
    "ROCM_AITER_TRITON_MLA": "AITER Triton MLA",
    "ROCM_AITER_UNIFIED_ATTN": "AITER Triton unified",
    "ROCM_AITER_MLA_SPARSE": "AITER MLA sparse",
    "TRITON_ATTN": "Triton unified",
    "TRITON_MLA": "Triton MLA",
    "ROCM_ATTN": "ROCM_ATTN",
}

# Phrases of the older `Using <phrase> backend[ on V1 engine].` lines -> enum names. Keys are
# lower case; matching ignores case because releases spelt them differently (AITER/Aiter).
PHRASES = {
    "aiter flash attention": "ROCM_AITER_FA",
    "aiter mla": "ROCM_AITER_MLA",
    "aiter triton mla": "ROCM_AITER_TRITON_MLA",
    "aiter unified attention": "ROCM_AITER_UNIFIED_ATTN",
    "triton attention": "TRITON_ATTN",
    "triton": "TRITON_ATTN",
    "rocm attention": "ROCM_ATTN",
    "rocmflashattention": "ROCM_FLASH",
    "triton mla": "TRITON_MLA",
    "flash attention": "FLASH_ATTN",
    "flashattention": "FLASH_ATTN",
    "flashinfer": "FLASHINFER",
    "flashinfer mla": "FLASHINFER_MLA",
    "flashmla": "FLASHMLA",
    "cutlass mla": "CUTLASS_MLA",
    "flexattention": "FLEX_ATTENTION",
    "flex attention": "FLEX_ATTENTION",
    "xformers": "XFORMERS",
    "torch sdpa": "TORCH_SDPA",
    "ipex attention": "IPEX",
    "pallas": "PALLAS",
    "xpu mla sparse": "XPU_MLA_SPARSE",
    "sparse mla": "ROCM_AITER_MLA_SPARSE",
    "flash attention mla": "FLASH_ATTN_MLA",
    "turboquant attention": "TURBOQUANT",
}

PLATFORM_DEFAULTS = {"cpu": "CPU_ATTN"}

_ENUM = r"(?:AttentionBackendEnum\.|_Backend\.)?([A-Z][A-Z0-9_]*)"
# Ordered: the most specific shapes first.
_PATTERNS = (
    re.compile(r"Using " + _ENUM + r" attention backend out of potential backends"),
    re.compile(r"Using " + _ENUM + r" backend \(selected via --attention-backend\)"),
    re.compile(r"Using " + _ENUM + r" backend out of potential backends"),
    re.compile(r"Overriding with " + _ENUM + r" out of potential backends"),
    re.compile(r"Using " + _ENUM + r" backend\.\s*$"),
)
_PHRASE = re.compile(r"Using ([A-Za-z][A-Za-z ]*?) backend(?: on [A-Za-z0-9 ]+)?\.\s*$")
_CPU_REJECTED = re.compile(r"Cannot use " + _ENUM + r" backend on CPU\.")
# Lines that mention a backend but not the model's attention.
_NOT_MODEL = re.compile(r"for vit attention|for ViT model|vit attention|SSM state", re.IGNORECASE)


@dataclass(frozen=True)
class BackendInfo:
    name: str  # the enum name, e.g. ROCM_AITER_FA
    label: str  # what to show, e.g. "AITER MHA"
    source: str  # log | flag | default (snapshot.BACKEND_SOURCES)
    line: str | None = None  # the log line it was read from


def label_for(name: str) -> str:
    """The name to show for an enum name: the AMD guides' name where there is one."""
    return LABELS.get(name, name)


def backend_from_line(line: str) -> str | None:
    """The backend enum name a log line announces, or None when it announces none."""
    if "backend" not in line or _NOT_MODEL.search(line):
        return None
    for pattern in _PATTERNS:
        m = pattern.search(line)
        if m:
            return m.group(1)
    m = _PHRASE.search(line)
    if m:
        return PHRASES.get(m.group(1).strip().lower())
    return None


def cpu_rejected_flag(line: str) -> str | None:
    """`Cannot use X backend on CPU.`: the CPU build ignored a requested backend X."""
    m = _CPU_REJECTED.search(line)
    return m.group(1) if m else None


def normalize_flag(value: object) -> str | None:
    """An `--attention-backend` value as an enum name (`flash_attn` -> FLASH_ATTN)."""
    if value is None or value is False or value is True:
        return None
    text = str(value).strip()
    if not text:
        return None
    if text.startswith("AttentionBackendEnum."):
        text = text[len("AttentionBackendEnum.") :]
    return text.upper().replace("-", "_")


def resolve_backend(
    log_name: str | None,
    flag: object = None,
    platform: str | None = None,
    log_line: str | None = None,
    cpu_rejected: bool = False,
) -> BackendInfo | None:
    """Decide what to report: the log's answer, else the flag, else the platform default.

    `platform` is "cpu", "cuda", "rocm", ... or None when unknown; `cpu_rejected` says the CPU
    build logged that it ignored the flag (so its default is what runs, and the log said so).
    """
    if log_name:
        return BackendInfo(log_name, label_for(log_name), "log", log_line)
    if platform == "cpu" and cpu_rejected:
        cpu_default = PLATFORM_DEFAULTS["cpu"]
        return BackendInfo(cpu_default, label_for(cpu_default), "log", log_line)
    flag_name = normalize_flag(flag)
    if flag_name:
        return BackendInfo(flag_name, label_for(flag_name), "flag")
    default = PLATFORM_DEFAULTS.get(platform or "")
    if default:
        return BackendInfo(default, label_for(default), "default")
    return None


class BackendDetector:
    """Feed it start-up log lines in order; it remembers the first backend announced, the
    platform, and whether the CPU build rejected a requested backend."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.line: str | None = None
        self.platform: str | None = None
        self.cpu_rejected_line: str | None = None

    def feed(self, line: str) -> None:
        if self.platform in (None, "cuda") and self.name is None:
            # ROCm builds say `cuda` in places (torch's device type); a ROCm line settles it.
            found = platform_from_line(line)
            if found is not None and (self.platform is None or found == "rocm"):
                self.platform = found
        if self.name is not None or "backend" not in line:
            return
        name = backend_from_line(line)
        if name is not None:
            self.name, self.line = name, line.strip()
            return
        if self.cpu_rejected_line is None and cpu_rejected_flag(line):
            self.cpu_rejected_line = line.strip()

    def result(self, flag: object = None, platform: str | None = None) -> BackendInfo | None:
        """The backend to report; `platform` overrides the one read from the log."""
        plat = platform or self.platform
        if self.name is None and self.cpu_rejected_line is not None:
            return resolve_backend(None, flag, plat, self.cpu_rejected_line, cpu_rejected=True)
        return resolve_backend(self.name, flag, plat, self.line)


_DEVICE_CONFIG = re.compile(r"device_config=(\w+)")
_PLATFORM_HINTS = (
    (re.compile(r"\[rocm\.py:\d+\]|ROCm platform|Automatically detected platform rocm"), "rocm"),
    (re.compile(r"\[cuda\.py:\d+\]|Automatically detected platform cuda"), "cuda"),
    (
        re.compile(
            r"\[cpu(?:_worker)?\.py:\d+\]|CPU KV cache size|Automatically detected platform cpu"
        ),
        "cpu",
    ),
)


def platform_from_line(line: str) -> str | None:
    """The platform a start-up log line reveals (the engine config's `device_config=cpu`, a
    platform module's log prefix), or None."""
    m = _DEVICE_CONFIG.search(line)
    if m and m.group(1) in ("cpu", "cuda", "rocm", "xpu", "tpu", "hpu"):
        return m.group(1)
    for pattern, name in _PLATFORM_HINTS:
        if pattern.search(line):
            return name
    return None
