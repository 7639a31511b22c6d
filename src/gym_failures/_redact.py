"""Remove credentials and URL secrets from text before it becomes a failure reason, body excerpt or log line.

Two layers, because neither is enough alone:
- patterns: URL user info and query strings, `Authorization`-style schemes (Bearer, Basic, Token),
  well-known API-key shapes (`sk-...`, `xox?-...`, `ghp_...`, `AKIA...`), and `name=value` or
  `"name": "value"` pairs whose name says secret (key, token, secret, password, auth, cookie, session,
  signature, credential);
- known values: the caller passes the secrets it holds (the request's credential headers and query
  values, see `request_secrets`), and every occurrence of them is removed, whatever it looks like.

Redaction replaces a secret with `[REDACTED]`; it never shortens the rest of the text, so the bound is
applied after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from urllib.parse import parse_qsl

REDACTED = "[REDACTED]"

# Bounded repetitions and a token-start lookbehind keep every pattern linear in the text's length.
_SECRET_NAME = (
    r"(?<![\w.-])[\w.-]{0,64}?"
    r"(?:key|token|secret|passw(?:or)?d|pwd|auth|cookie|session|signature|credential)[\w.-]{0,64}"
)
_SCHEME = r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,30}://"


def _without_query(url: str) -> str:
    """`url` with its query string (up to a fragment) replaced; a `?` after a `#` is the fragment's."""
    start = url.find("?")
    if start < 0 or 0 <= url.find("#") < start:
        return url
    end = url.find("#", start)
    return f"{url[:start]}?{REDACTED}{url[end:] if end >= 0 else ''}"


# A URL is matched as one whole token and its query cut in Python: a pattern that looked for the `?`
# after each scheme rescanned the rest of the text from every `x://` in it (quadratic; 200 KB of
# "a://" took a minute).
_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # scheme://user:password@host -> scheme://[REDACTED]@host
    # (to the authority's last "@": a password may hold a raw "@" of its own)
    (re.compile(rf"(?i)({_SCHEME})[^/?#\s]*@"), rf"\1{REDACTED}@"),
    # Any URL's query string: its values are the request's, not ours to repeat.
    (re.compile(rf"(?i){_SCHEME}[^\s\"']*"), lambda match: _without_query(match.group())),
    (re.compile(r"(?i)\b(bearer|basic|token|digest)\s+[A-Za-z0-9._~+/=-]{4,}"), rf"\1 {REDACTED}"),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{6,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{6,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{12,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), REDACTED),  # Google API keys
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),  # Hugging Face tokens
    # JSON Web Tokens: three base64url parts, the first a JSON object ("eyJ" is '{"').
    # (from a token's start only: from every "eyJ" inside one, the scan was quadratic)
    (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),
    # name=value, name: value, "name": "value" where the name says secret. A value that is already the
    # marker is matched whole, so redacting twice (each hop does) does not grow it to "[REDACTED]]".
    (
        re.compile(
            rf"(?i)([\"']?{_SECRET_NAME}[\"']?\s*[:=]\s*)"
            rf"({re.escape(REDACTED)}|\"[^\"]*\"|'[^']*'|[^\s,;&\"'}}\]]+)"
        ),
        rf"\1{REDACTED}",
    ),
)

# Every pattern above needs one of these (case aside) in the text: "://", an authorization scheme
# word, a key prefix, or a secret-sounding name. Most reasons hold none, and a few substring searches
# cost a fraction of running the patterns (or one alternation regex, which backtracks per position).
_SCREEN_WORDS = (
    "://", "bearer", "basic", "token", "digest", "sk-", "pk-", "rk-", "xox", "ghp_", "gho_", "ghu_",
    "ghs_", "ghr_", "akia", "aiza", "hf_", "eyj", "key", "secret", "passw", "pwd", "auth", "cookie",
    "session", "signature", "credential",
)  # fmt: skip


def _may_hold_a_secret(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _SCREEN_WORDS)


# Values shorter than this are not removed as known secrets: "1" or "true" would shred the text.
MIN_KNOWN_SECRET = 6

_CREDENTIAL_HEADER = re.compile(
    rf"(?i)^(?:authorization|proxy-authorization|cookie|set-cookie|{_SECRET_NAME})$"
)


def redact(text: str, known_secrets: Iterable[str] = ()) -> str:
    """`text` without the known secrets and anything shaped like a credential or a URL secret."""
    if known_secrets:
        known = {s for s in known_secrets if len(s) >= MIN_KNOWN_SECRET}
        for secret in sorted(known, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
    if not _may_hold_a_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def url_without_secrets(url: str) -> str:
    """`url` without user info, query string and fragment: the parts that carry tokens."""
    text = re.sub(r"(?i)^([a-z][a-z0-9+.-]*://)[^/?#]*@", r"\1", url)
    for separator in ("?", "#"):
        text = text.split(separator, 1)[0]
    return text


def request_secrets(headers: Iterable[tuple[bytes, bytes]], query_string: bytes) -> list[str]:
    """The secrets an ASGI request carries: credential header values (and their tokens) and every
    query value."""
    secrets: list[str] = []
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if not _CREDENTIAL_HEADER.match(name):
            continue
        value = raw_value.decode("latin-1").strip()
        secrets.append(value)
        if name in ("authorization", "proxy-authorization"):
            secrets.append(value.split(None, 1)[-1])  # the credential without its scheme word
        elif name in ("cookie", "set-cookie"):
            secrets.extend(part.split("=", 1)[-1].strip() for part in value.split(";"))
    if query_string:
        for _, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=False):
            secrets.append(value)
        # A reason quotes the URL as it was sent, percent-encoding and "+" included.
        for part in query_string.split(b"&"):
            raw = part.partition(b"=")[2].decode("latin-1")
            if raw and raw not in secrets:
                secrets.append(raw)
    return secrets
