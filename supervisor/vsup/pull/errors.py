"""Why a pull failed, as a short reason (status JSON, journal) and a sentence for a person."""

from __future__ import annotations

# `reason` values (status JSON `pulls[].reason`, journal `pull` events).
REASONS = (
    "no_space",  # the cache's disk has less free space than the files still to fetch
    "unauthorized",  # 401: a gated or private model and no (valid) token
    "forbidden",  # 403: the token has no access (a gated model's licence not accepted)
    "not_found",  # no such model or revision on the hub
    "no_token",  # hf_token_env names a variable that is not set
    "offline",  # HF_HUB_OFFLINE is set: vsup does not ask the hub
    "network",  # the hub is out of reach, or a connection broke beyond huggingface_hub retries
    "cancelled",  # Ctrl-C, `vsup down`, a new apply that no longer needs it
    "error",  # anything else (the message says what)
)
CANCELLED = "cancelled"  # the reason code compares against (one of REASONS)


class PullError(Exception):
    """A pull that cannot go on: `reason` (one of REASONS) and a message saying what to do."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason if reason in REASONS else "error"
        self.message = message


class PullCancelled(PullError):
    """Raised inside a download thread once the pull was cancelled (Ctrl-C, SIGTERM)."""

    def __init__(self, message: str = "the pull was cancelled") -> None:
        super().__init__("cancelled", message)
