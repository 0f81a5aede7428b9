"""A node that can reach a hub: the fake hub of the test (tests/fakehub) at HF_ENDPOINT, a
Hugging Face cache of its own, HF_HUB_OFFLINE unset (the suite sets it everywhere else)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakehub.models import sharded_repo, tiny_repo
from tests.fakehub.server import FakeHub

MiB = 1024 * 1024
TOKEN = "hf_fake_token_granted_0123456789"
DENIED = "hf_fake_token_not_granted_98765"


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # huggingface_hub keeps its token and small caches under HF_HOME: not the user's
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return cache


@pytest.fixture
def hub(tiny_model: Path, hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The fake hub serving `tiny/llama` (with files vLLM never loads beside it), `gated/llama`
    (the same, gated: TOKEN has access, DENIED has not) and `big/sharded` (1 + 24 MiB)."""
    repos = [
        tiny_repo("tiny/llama", tiny_model),
        tiny_repo("gated/llama", tiny_model, gated=True, tokens=(TOKEN,), denied=(DENIED,)),
        sharded_repo("big/sharded", [1 * MiB, 24 * MiB]),
    ]
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server
