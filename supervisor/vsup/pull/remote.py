"""What the hub says about a model, through huggingface_hub, and its errors as reasons.

`list_repo` is one request: `GET {endpoint}/api/models/{id}/revision/{rev}?blobs=true`
(`HfApi.model_info(files_metadata=True)`): the commit the revision points at and every file
with its size and blob id. The same errors come from each file's HEAD/GET later; `classify`
turns any of them into a `PullError` whose message says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vsup.pull.errors import PullError
from vsup.pull.selection import RepoFile


@dataclass(frozen=True)
class RepoListing:
    model: str
    revision: str  # as asked (a branch, tag or commit)
    commit: str  # what it points at now
    files: tuple[RepoFile, ...]


def endpoint() -> str:
    """The hub huggingface_hub talks to (`HF_ENDPOINT`, else huggingface.co)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def list_repo(
    model: str, revision: str, token: str | None, timeout: float = 30.0, hub: str | None = None
) -> RepoListing:
    """The files of `model` at `revision` (raises PullError)."""
    from huggingface_hub import HfApi

    where = hub or endpoint()
    try:
        info = HfApi(endpoint=where, token=token).model_info(
            model, revision=revision, files_metadata=True, timeout=timeout
        )
    except Exception as exc:
        raise classify(exc, model, revision, where, token is not None) from None
    if not info.sha:
        raise PullError("error", f"{where} gave no commit for {model}@{revision}")
    files = []
    for s in info.siblings or ():
        blob = s.lfs.sha256 if s.lfs is not None else s.blob_id
        size = s.lfs.size if s.lfs is not None else s.size
        files.append(RepoFile(s.rfilename, int(size) if size is not None else None, blob))
    return RepoListing(model, revision, info.sha, tuple(files))


def _status(exc: BaseException) -> int | None:
    response: Any = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


_LOGIN = (
    "set the layout's hf_token_env to a variable holding a token with access (or export "
    "HF_TOKEN, or `hf auth login`)"
)


def classify(exc: BaseException, model: str, revision: str, hub: str, had_token: bool) -> PullError:
    """A huggingface_hub (or network) error as a PullError a person can act on."""
    if isinstance(exc, PullError):
        return exc
    status = _status(exc)
    known = _hub_error(exc, model, revision, hub, had_token, status)
    if known is not None:
        return known
    if status == 401:
        return PullError("unauthorized", f"{hub} answered 401 for {model}: {_LOGIN}")
    if status == 403:
        return PullError(
            "forbidden", f"{hub} answered 403 for {model}: the token has no access to it"
        )
    if status is not None:
        return PullError("network", f"{hub} answered HTTP {status} for {model}: {_first_line(exc)}")
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)) or _is_transport_error(exc):
        return PullError(
            "network", f"the hub ({hub}) cannot be reached or broke off: {_first_line(exc)}"
        )
    return PullError("error", f"{type(exc).__name__}: {_first_line(exc)}")


def _hub_error(
    exc: BaseException, model: str, revision: str, hub: str, had_token: bool, status: int | None
) -> PullError | None:
    """huggingface_hub's own errors (gated, no such revision/model/file, offline); None for
    the rest."""
    from huggingface_hub import errors as hf_errors

    what = "the token was refused" if had_token else "no token was sent"
    if isinstance(exc, hf_errors.GatedRepoError):
        if status == 403 or (had_token and status != 401):
            return PullError(
                "forbidden",
                f"{model} is gated on {hub} and the token has no access to it: accept its "
                f"licence at {hub}/{model} with the token's account",
            )
        return PullError(
            "unauthorized",
            f"{model} is gated on {hub} and {what} (HTTP {status or 401}): {_LOGIN}",
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return PullError(
            "not_found", f"{model} on {hub} has no revision {revision!r}: check the revision key"
        )
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        if status == 401:
            return PullError(
                "unauthorized",
                f"{hub} refused {model} (HTTP 401: {what}); it does not exist or it is private: "
                f"check the id, or {_LOGIN}",
            )
        return PullError("not_found", f"{hub} has no model {model}: check the id")
    if isinstance(exc, hf_errors.EntryNotFoundError):
        return PullError("not_found", f"{model}@{revision} on {hub}: {_first_line(exc)}")
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return PullError(
            "offline", "HF_HUB_OFFLINE is set, so vsup does not ask the hub: unset it to pull"
        )
    return None


def _is_transport_error(exc: BaseException) -> bool:
    # huggingface_hub 2 uses its own copy of httpx (`httpx2`), 0.2x/1.x requests or httpx:
    # match their transport errors by name rather than import every one.
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(
        names
        & {
            "TransportError",
            "ConnectError",
            "TimeoutException",
            "RemoteProtocolError",
            "NetworkError",
            "ConnectionError",
            "ReadTimeout",
            "ChunkedEncodingError",
        }
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
