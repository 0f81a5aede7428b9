"""A hub model's config and weight sizes without downloading its weights.

Where `vsup plan` looks, first hit wins:
1. the local Hugging Face cache (a snapshot with `config.json`: modelinfo.hub_snapshot);
2. vsup's own cache, `$VSUP_HOME/cache/hub/ORG--NAME.json`, written by step 3;
3. the hub, through `huggingface_hub` (when it is installed and `HF_HUB_OFFLINE` is not set):
   `config.json` (a few KiB) and the safetensors headers (`get_safetensors_metadata`: HTTP
   range requests of each file's first bytes, never the tensors). `HF_ENDPOINT` and `HF_TOKEN`
   work as for every Hugging Face tool.

`huggingface_hub` is an optional import: a node without it plans from the caches.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vsup import paths
from vsup.fsutil import write_atomic

CACHE_SCHEMA = 1


@dataclass(frozen=True)
class WeightSummary:
    """What the safetensors headers say, summed over the files."""

    files: int
    bytes: int
    params: int
    dominant_dtype: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "params": self.params,
            "dominant_dtype": self.dominant_dtype,
        }

    @classmethod
    def from_json(cls, doc: Any) -> WeightSummary | None:
        if not isinstance(doc, Mapping):
            return None
        try:
            return cls(
                int(doc["files"]), int(doc["bytes"]), int(doc["params"]), doc.get("dominant_dtype")
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class HubModel:
    """A hub model's config (None when it could not be had) and weight summary."""

    config: dict[str, Any] | None
    weights: WeightSummary | None
    source: str  # where it came from, for the budget's "why"
    problem: str | None = None  # why the config is missing: what to do about it


def cache_file(model: str) -> Path | None:
    """`$VSUP_HOME/cache/hub/ORG--NAME.json`, or None when the directory cannot be made."""
    try:
        d = paths.vsup_home() / "cache" / "hub"
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return d / (re.sub(r"[^A-Za-z0-9_.-]", "-", model.replace("/", "--")) + ".json")


def read_cached(model: str) -> HubModel | None:
    path = cache_file(model)
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != CACHE_SCHEMA or doc.get("model") != model:
        return None
    config = doc.get("config")
    if not isinstance(config, dict):
        return None
    fetched = time.strftime("%Y-%m-%d", time.gmtime(doc.get("at", 0)))
    return HubModel(
        config,
        WeightSummary.from_json(doc.get("weights")),
        f"vsup's cache of the hub's files ({path}, fetched {fetched}; delete it to fetch again)",
    )


def _write_cache(model: str, found: HubModel) -> Path | None:
    path = cache_file(model)
    if path is None:
        return None
    doc = {
        "schema": CACHE_SCHEMA,
        "model": model,
        "at": time.time(),
        "config": found.config,
        "weights": found.weights.to_json() if found.weights else None,
    }
    try:
        write_atomic(path, json.dumps(doc), mode=0o600)
    except OSError:
        return None
    return path


def _offline(env: Mapping[str, str]) -> bool:
    return str(env.get("HF_HUB_OFFLINE", "")).strip().lower() in ("1", "true", "yes", "on")


def _unreachable(endpoint: str, timeout: float = 3.0) -> str | None:
    """Why a TCP connection to the hub fails at once (None: it connects, or a proxy is set).
    huggingface_hub retries a refused connection with back-off for about half a minute."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return None
    parts = urlsplit(endpoint)
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{parts.hostname}:{port}: {exc.strerror or exc}"


def summarize_metadata(meta: Any) -> WeightSummary:
    """A `SafetensorsRepoMetadata` as byte, element and dtype totals."""
    total = params = 0
    by_dtype: dict[str, int] = {}
    for file_meta in meta.files_metadata.values():
        for info in file_meta.tensors.values():
            begin, end = info.data_offsets
            nbytes = int(end) - int(begin)
            total += nbytes
            params += int(info.parameter_count)
            by_dtype[str(info.dtype)] = by_dtype.get(str(info.dtype), 0) + nbytes
    dominant = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None
    return WeightSummary(len(meta.files_metadata), total, params, dominant)


def fetch(model: str, timeout: float = 20.0) -> HubModel:
    """config.json and the safetensors headers from the hub (no cache involved)."""
    try:
        import huggingface_hub as hf
        from huggingface_hub import constants as hf_constants
    except ImportError:
        return HubModel(
            None,
            None,
            "",
            "huggingface_hub is not installed here, so the hub cannot be asked (pip install "
            "huggingface_hub)",
        )
    endpoint = hf_constants.ENDPOINT
    unreachable = _unreachable(endpoint)
    if unreachable:
        return HubModel(None, None, "", f"the hub ({endpoint}) cannot be reached: {unreachable}")
    config, problem = _fetch_config(model, endpoint, timeout)
    if problem is not None:
        return HubModel(None, None, "", problem)
    if not isinstance(config, dict):
        return HubModel(None, None, "", f"{model}'s config.json on {endpoint} is not an object")
    weights = _fetch_weights(hf, model)
    what = "config.json" + (" and safetensors headers" if weights else "")
    return HubModel(config, weights, f"the hub ({endpoint}): {what}")


def _fetch_config(model: str, endpoint: str, timeout: float) -> tuple[Any, str | None]:
    """(config.json's content, None), or (None, why the hub did not give it)."""
    import huggingface_hub as hf
    from huggingface_hub import errors as hf_errors

    try:
        with tempfile.TemporaryDirectory(prefix="vsup-hub-") as tmp:
            path = hf.hf_hub_download(model, "config.json", cache_dir=tmp, etag_timeout=timeout)
            return json.loads(Path(path).read_text()), None
    except hf_errors.LocalEntryNotFoundError as exc:
        # raised after the retries when the hub did not answer
        reason = str(exc).splitlines()[0][:200]
        return None, f"the hub ({endpoint}) cannot be reached: {reason}"
    except hf_errors.GatedRepoError:
        return None, (
            f"{model} is gated on {endpoint}: accept its licence there and log in "
            "(`hf auth login`, or export HF_TOKEN)"
        )
    except hf_errors.RepositoryNotFoundError:
        return None, (
            f"{endpoint} has no model {model} (or it is private: log in with `hf auth login`); "
            "check the id"
        )
    except hf_errors.EntryNotFoundError:
        return None, f"{model} on {endpoint} has no config.json"
    except (OSError, ValueError, hf_errors.HfHubHTTPError) as exc:
        # connection refused, DNS, timeouts, offline mode: the node cannot reach the hub
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, f"the hub ({endpoint}) cannot be reached: {reason}"


def _fetch_weights(hf: Any, model: str) -> WeightSummary | None:
    """The safetensors headers' totals; None for a repository without them (the parameters
    come from the config then) or when they cannot be read."""
    from huggingface_hub import errors as hf_errors

    try:
        return summarize_metadata(hf.get_safetensors_metadata(model))
    except (hf_errors.NotASafetensorsRepoError, hf_errors.SafetensorsParsingError):
        return None  # parameters from the config then
    except (OSError, ValueError, hf_errors.HfHubHTTPError):
        return None


def hub_model(model: str, env: Mapping[str, str] | None = None) -> HubModel:
    """The config and weight sizes of hub id `model` from vsup's cache or the hub (the local
    Hugging Face cache is modelinfo's first look). `problem` says why none was had."""
    env = os.environ if env is None else env
    cached = read_cached(model)
    if cached is not None:
        return cached
    if _offline(env):
        return HubModel(
            None,
            None,
            "",
            f"{model} is in neither the Hugging Face cache nor vsup's, and HF_HUB_OFFLINE is set: "
            f"unset it to ask the hub, or fetch the config (`hf download {model} config.json`)",
        )
    found = fetch(model)
    if found.config is None:
        return HubModel(
            None,
            None,
            "",
            f"{model} is in neither the Hugging Face cache nor vsup's, and {found.problem}",
        )
    path = _write_cache(model, found)
    if path is not None:
        return HubModel(found.config, found.weights, f"{found.source}, cached in {path}")
    return found
