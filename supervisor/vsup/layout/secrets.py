"""What counts as a secret: the one rule for names (masking, validation) and for values.

A layout is kept in git and its flags show in `ps` to every user, in run logs, the journal and
the state file; so vsup refuses secrets in it (validation) and masks secret-named variables
wherever it shows an environment (the daemon's config route, the dashboard).

Names: a variable or flag names a secret when its last word ends in KEY, TOKEN, SECRET,
PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL(S): `HF_TOKEN`, `VLLM_API_KEY`, `api-key`,
`hf-token`, `AWS_SECRET_ACCESS_KEY`, `DB_PASSWD`. Words are split at `_`, `-` and `.`, so
`TOKENIZERS_PARALLELISM`, `max-num-batched-tokens`, `ssl-keyfile` and `PASSWORD_FILE` (a path)
are not secrets.

Values: a string looks like a token when it carries a known token prefix (`hf_`, `sk-`, `ghp_`,
`github_pat_`, `glpat-`, `xox?-`, `AKIA`, a JWT, `Bearer ...`) or is one long random-looking
word. Model ids and paths hold `/` or `.`, commit hashes and UUIDs are hex: none of those is
taken for a token. A value also carries a credential when it holds a URL with a password
(`https://user:pass@host`) or, on one line, a `NAME=VALUE` pair whose NAME names a secret by the
rule above (`password=...`, `token=...`, `?api_key=...` in a URL, a DSN's `password=`); a
placeholder (`$VAR`, `${VAR}`, `<...>`, `***`) is not a credential.
"""

from __future__ import annotations

import math
import re
from collections import Counter

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE")
# The last word of the name ends in a secret word (CREDENTIAL(S) too); searched, so that
# `SECRET_NAME.search(name)` is the test (the daemon and the dashboard mask with it).
SECRET_NAME = re.compile(
    r"(?:^|[_.\-])[A-Za-z0-9]*(?:" + "|".join(SECRET_WORDS) + r"|CREDENTIALS?)$",
    re.IGNORECASE,
)

# Tokens of well-known services, wherever they appear in a value.
_PREFIXED = (
    (re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{20,}"), "an API key (sk-...)"),
    (
        re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,})"),
        "a GitHub token",
    ),
    (re.compile(r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_\-]{20,}"), "a GitLab token"),
    (re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9\-]{10,}"), "a Slack token"),
    (re.compile(r"(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}(?![A-Za-z0-9])"), "an AWS access key"),
    (re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"), "a JWT"),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9_\-.=+/]{16,}"), "a bearer token"),
)
# One word of letters, digits and `_-+=` (no `/`, `.`, `:` or space: not a path, model id,
# host or sentence), long enough to be a credential.
_WORD = re.compile(r"[A-Za-z0-9_\-+=]{32,}")
_HEX = re.compile(r"[0-9a-fA-F\-]+")
_CAMEL_WORD = re.compile(r"[A-Z]?[a-z]{3,}")
# Shannon entropy (bits per character) above which such a word is random rather than named:
# random base62 of 32+ characters measures ~4.5-5.5; long identifiers made of words stay below.
_ENTROPY_BITS = 4.2


# A URL whose user part has a password: scheme://user:password@host
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:([^/\s@]+)@")
# NAME=VALUE after a separator a URL query, a DSN or a command line uses
_PAIR = re.compile(r"(?:^|[?&;,\s])([A-Za-z][A-Za-z0-9_.\-]*)=([^\s&;,]+)")
_PLACEHOLDER = re.compile(r"^(?:\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|<[^>]*>|\*+|\.\.\.)$")
# what secret_value_kind says of a credential inside a longer value (the fix differs)
URL_PASSWORD = "a URL with a password in it (user:password@host)"
SECRET_PAIR = "a credential ({name}=...)"


def credential_kind(value: str) -> str | None:
    """What credential a longer value carries ("a URL with a password in it ..."), else None."""
    m = _URL_PASSWORD.search(value)
    if m and not _PLACEHOLDER.match(m.group(1)):
        return URL_PASSWORD
    if "\n" in value:
        return None  # a multi-line text (a chat template, say): its `x=y` are not settings
    for m in _PAIR.finditer(value):
        name, secret = m.group(1), m.group(2).strip("'\"")
        if is_secret_name(name) and secret and not _PLACEHOLDER.match(secret):
            return SECRET_PAIR.format(name=name)
    return None


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name names a secret (see the module docstring)."""
    return bool(SECRET_NAME.search(name.strip()))


def secret_value_kind(value: str) -> str | None:
    """What a string looks like when it looks like a credential ("a Hugging Face token"), else
    None."""
    carried = credential_kind(value)
    if carried:
        return carried
    for pattern, kind in _PREFIXED:
        if pattern.search(value):
            return kind
    text = value.strip()
    if not _WORD.fullmatch(text) or _HEX.fullmatch(text):
        return None
    if not (
        any(c.islower() for c in text)
        and any(c.isupper() for c in text)
        and any(c.isdigit() for c in text)
    ):
        return None
    # The longest run without a separator: tokens are one random run, identifiers are words.
    longest = max(len(part) for part in re.split(r"[_\-+=]", text))
    if longest < 20 or _entropy(text) < _ENTROPY_BITS:
        return None
    # CamelCase names ("DeepSeekCoderV2LiteInstruct") are mostly words of 3+ letters; a random
    # token has few of them.
    in_words = sum(len(w) for w in _CAMEL_WORD.findall(text))
    if in_words >= len(text) / 2:
        return None
    return "a long random token"


def _entropy(text: str) -> float:
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())
