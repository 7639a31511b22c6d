"""Remove credentials and URL secrets from text before it becomes a failure reason, body excerpt or log line.

Two layers, because neither is enough alone:
- patterns: URL user info, well-known API-key shapes (`sk-...`, `xox?-...`, `ghp_...`, `AKIA...`,
  JSON Web Tokens), the value of an `Authorization` header, and `name=value` or `"name": "value"`
  pairs (a URL's query parameters among them) whose name says secret: one of its words
  (`name_words`) is in `SECRET_NAME_WORDS` (key, token, secret, password, auth, cookie, session,
  signature, credential, ...);
- a credential named in prose only when it looks like one: the word after `Bearer`, `Basic`,
  `Token` or `Digest`, after "API key:", or after an unquoted one-word name and a colon
  ("token: ..."), is removed when it has a credential's shape (`looks_like_credential`), never when it
  is an ordinary word ("send it as a Bearer token", "the token budget ran out");
- known values: the caller passes the secrets it holds (the request's credential headers, cookies,
  Basic credentials and query values, see `request_secrets`), and a server registers the secrets it
  holds itself (its provider keys: `register_secret`) and shapes of its own (`register_secret_pattern`);
  every occurrence of them is removed, whatever it looks like.

A text cut to its bound ends in "…"; a known secret that straddled the cut leaves its first
characters before the marker, and those are removed too.

Redaction replaces a secret with `[REDACTED]`; it never shortens the rest of the text, so the bound is
applied after it. It never eats ordinary words: a message a person reads keeps every word that is not
a secret, and a `key=value` pair whose name is no secret name (`max_tokens=4096`, `page=2`) is kept.
A request's own query values are still removed wherever they appear: they are known secrets
(`request_secrets`), whatever their names.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "CUT_MARK",
    "MIN_KNOWN_SECRET",
    "REDACTED",
    "SECRET_NAME_WORDS",
    "cut_secret_length",
    "forget_registered_secrets",
    "has_registered_secrets",
    "is_secret_name",
    "looks_like_credential",
    "name_words",
    "redact",
    "redact_values",
    "register_secret",
    "register_secret_pattern",
    "registered_secrets",
    "request_secrets",
    "url_secrets",
    "url_without_secrets",
    "without_a_cut_secret",
]

REDACTED = "[REDACTED]"

# Bounded repetitions and a token-start lookbehind keep every pattern linear in the text's length.
_SECRET_NAME = (
    r"(?<![\w.-])[\w.-]{0,64}?"
    r"(?:key|token|secret|passw(?:or)?d|pwd|passphrase|auth|cookie|session|sig|credential|jwt)[\w.-]{0,64}"
)
_SCHEME = r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,30}://"


SECRET_NAME_WORDS: frozenset[str] = frozenset(
    {
        "key", "keys", "apikey", "accesskey", "secretkey", "privatekey",
        "token", "accesstoken", "authtoken", "jwt",
        "secret", "secrets", "password", "passwd", "pwd", "passphrase",
        "auth", "oauth", "authorization", "credential", "credentials",
        "cookie", "cookies", "session", "sessionid", "signature", "sig",
    }
)  # fmt: skip
"""The words that make a name secret (`is_secret_name`): whole words of the name, never substrings
(`author`, `monkey`, `tokenizer` and `max_tokens` are no secret names)."""

# A URL's query also carries one-time credentials under names of their own (OAuth's `code`).
_QUERY_SECRET_WORDS = SECRET_NAME_WORDS | {"code"}

_NAME_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def name_words(name: str) -> list[str]:
    """The words of a key, header or parameter name, in lower case: split on `_`, `-`, `.`, spaces and
    camelCase (`X-Api-Key`, `apiKey` and `api_key` are all `["api", "key"]`, after an `x` for the
    first)."""
    return [word.lower() for word in _NAME_PARTS.findall(name[:200])]


# A name whose last word is one of these names a thing, not a secret: `output_token_policy`,
# `tokenizer_model`, `auth_model` (while `policy_api_key` is a key).
_NOT_SECRET_HEADS = frozenset({"model", "models", "tokenizer", "policy"})


def is_secret_name(name: str, more_words: Iterable[str] = ()) -> bool:
    """Whether `name` names a secret: one of its words (`name_words`) is in `SECRET_NAME_WORDS` (or
    `more_words`), and its last word names no model, tokenizer or policy."""
    return _is_secret(name_words(name), SECRET_NAME_WORDS | frozenset(more_words))


def _is_secret(words: list[str], secret_words: frozenset[str]) -> bool:
    return bool(words) and words[-1] not in _NOT_SECRET_HEADS and any(word in secret_words for word in words)


_CREDENTIAL_PREFIXES = (
    "sk-", "pk-", "rk-", "sk_", "pk_", "rk_", "whsec_", "xoxa-", "xoxb-", "xoxp-", "xoxr-", "xoxs-",
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "AKIA", "AIza", "hf_", "gsk_",
    "xai-", "eyJ",
)  # fmt: skip
_CREDENTIAL_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")


def looks_like_credential(value: str) -> bool:
    """Whether `value` (one word) has a credential's shape rather than a word's: a known key prefix
    (`sk-`, `ghp_`, `AKIA`, a JSON Web Token's `eyJ`, ...), or at least 8 characters of a token's
    alphabet (letters, digits, `._~+/=-`) mixing letters and digits, or at least 16 mixing upper and
    lower case past the first letter. Ordinary words, numbers and `gpt`-style names below 8
    characters are not."""
    if value == REDACTED or value.startswith(_CREDENTIAL_PREFIXES):
        return True
    if len(value) < 8 or _CREDENTIAL_CHARS.fullmatch(value) is None:
        return False
    letters = any(char.isalpha() for char in value)
    if letters and any(char.isdigit() for char in value):
        return True
    rest = value[1:]
    return len(value) >= 16 and any(char.isupper() for char in rest) and any(char.islower() for char in rest)


def _is_basic_credential(value: str) -> bool:
    """Whether `value` is a Basic credential: base64, 8 characters at least and not all lower-case
    letters, of a printable `user:password`. One four-letter lower-case word in 730 decodes to some
    `user:password` (`ajpa` is `j:Z`); a word is kept, and a request's own `Authorization` value,
    however short or plain, is a known secret (`request_secrets`)."""
    if len(value) < 8 or (value.isalpha() and value.islower()):
        return False
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    # `echo user:pw | base64` encodes the newline too: white space is a credential's as well.
    return ":" in decoded and all(char.isprintable() or char in "\t\r\n" for char in decoded)


def _scheme_credential(match: re.Match[str]) -> str:
    scheme, value = match.group(1), match.group(2)
    # A full stop after the credential is the sentence's ("... sent Basic dXNl."): kept, and not read
    # as the credential's (a Basic credential with it is no base64).
    credential = value.rstrip(".") or value
    secret = looks_like_credential(credential) or (
        scheme.lower() == "basic" and _is_basic_credential(credential)
    )
    return f"{scheme} {REDACTED}{value[len(credential) :]}" if secret else match.group()


def _without_query_secrets(url: str) -> str:
    """`url` with the values of its secret-named query parameters replaced; a `?` after a `#` is the
    fragment's. A URL in a parameter's value is read alike: every `?` or `&` after the first `?`
    starts a parameter (one pass, however deep the nesting)."""
    start = url.find("?")
    if start < 0 or 0 <= url.find("#") < start:
        return url
    end = url.find("#", start)
    end = len(url) if end < 0 else end
    parts = _QUERY_SEPARATORS.split(url[start + 1 : end])
    for index in range(0, len(parts), 2):
        name, equals, value = parts[index].partition("=")
        if equals and value and _is_secret(name_words(unquote(name)), _QUERY_SECRET_WORDS):
            parts[index] = f"{name}={REDACTED}"
    return f"{url[: start + 1]}{''.join(parts)}{url[end:]}"


_QUERY_SEPARATORS = re.compile(r"([?&])")


# Names that are a secret's whatever follows a colon: "password: ...", "secret: ...".
_ALWAYS_SECRET_WORDS = frozenset({"secret", "secrets", "password", "passwd", "pwd", "passphrase"})


def _pair(match: re.Match[str]) -> str:
    """A `name=value`, `name: value` or `"name": "value"` pair with its value replaced when the name
    is a secret name: always for `=` or a quoted name (data: a config line, JSON, a header line's
    compound name); for an unquoted one-word name and a colon ("token: ..." in prose) only when the
    value looks like a credential, or the name is always a secret's ("password: ...")."""
    name, value = match.group("name"), match.group("value")
    words = name_words(name)
    if not _is_secret(words, SECRET_NAME_WORDS):
        return match.group()
    quoted = bool(match.group("open") or match.group("close"))
    prose = match.group("sep") == ":" and not quoted and len(words) == 1
    if prose and words[0] not in _ALWAYS_SECRET_WORDS and not looks_like_credential(value.strip("\"'")):
        return match.group()
    return f"{match.group('lead')}{REDACTED}"


# A URL is matched as one whole token and its query cut in Python: a pattern that looked for the `?`
# after each scheme rescanned the rest of the text from every `x://` in it (quadratic; 200 KB of
# "a://" took a minute).
_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # scheme://user:password@host -> scheme://[REDACTED]@host
    # (to the authority's last "@": a password may hold a raw "@" of its own)
    (re.compile(rf"(?i)({_SCHEME})[^/?#\s]*@"), rf"\1{REDACTED}@"),
    # A URL's query parameters whose names say secret.
    (re.compile(rf"(?i){_SCHEME}[^\s\"']*"), lambda match: _without_query_secrets(match.group())),
    # An Authorization header's value, scheme word and credential, whatever the credential looks like.
    (
        re.compile(
            r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
            r"(?:bearer|basic|token|digest)\s+[^\s,;\"'}\]]+"
        ),
        rf"\1{REDACTED} {REDACTED}",
    ),
    # A scheme word and the credential after it, when it looks like one ("a Bearer token" is prose).
    (re.compile(r"(?i)\b(bearer|basic|token|digest)\s+([A-Za-z0-9._~+/=-]{4,})"), _scheme_credential),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{6,}"), REDACTED),
    (re.compile(r"\b(?:sk|pk|rk|whsec)_(?:live|test)_[A-Za-z0-9]{10,}"), REDACTED),  # Stripe-style keys
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{6,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{12,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), REDACTED),  # Google API keys
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),  # Hugging Face tokens
    (re.compile(r"\bgsk_[A-Za-z0-9]{20,}"), REDACTED),  # Groq keys
    (re.compile(r"\bxai-[A-Za-z0-9]{20,}"), REDACTED),  # xAI keys
    # A provider quoting the key it refused: "Incorrect API key provided: <key>", "invalid api key <key>"
    # (a bare hex key has no shape of its own; the phrase before it is the evidence, and the value's
    # shape: "API key: send it as ..." goes on in prose).
    (
        re.compile(r"(?i)(\bapi[ _-]?key\b(?:\s+provided)?\s*[:=]?\s*)([A-Za-z0-9._~+/-]{12,})"),
        lambda match: match.group(1) + REDACTED if looks_like_credential(match.group(2)) else match.group(),
    ),
    # JSON Web Tokens: three base64url parts, the first a JSON object ("eyJ" is '{"').
    # (from a token's start only: from every "eyJ" inside one, the scan was quadratic)
    (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),
    # name=value, name: value, "name": "value" where the name says secret (`_pair`). A value that is
    # already the marker is matched whole, so redacting twice (each hop does) does not grow it to
    # "[REDACTED]]".
    (
        re.compile(
            rf"(?i)(?P<lead>(?P<open>[\"']?)(?P<name>{_SECRET_NAME})(?P<close>[\"']?)\s*(?P<sep>[:=])\s*)"
            rf"(?P<value>{re.escape(REDACTED)}|\"[^\"]*\"|'[^']*'|[^\s,;&\"'}}\]]+)"
        ),
        _pair,
    ),
)

# Every pattern above needs one of these (case aside) in the text: "://", an authorization scheme
# word, a key prefix, or a secret-sounding name. Most reasons hold none, and a few substring searches
# cost a fraction of running the patterns (or one alternation regex, which backtracks per position).
_SCREEN_WORDS = (
    "://", "bearer", "basic", "token", "digest", "sk-", "pk-", "rk-", "_live_", "_test_", "xox",
    "ghp_", "gho_", "ghu_",
    "ghs_", "ghr_", "akia", "aiza", "hf_", "gsk_", "xai-", "eyj", "key", "secret", "passw", "pwd",
    "passphrase", "auth", "cookie", "session", "sig", "credential", "jwt",
)  # fmt: skip


def _may_hold_a_secret(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _SCREEN_WORDS)


# Values shorter than this are not removed as known secrets: "1" or "true" would shred the text.
MIN_KNOWN_SECRET = 6

# A request's header whose name holds a secret word anywhere (`x-authtoken`, `x-goog-api-key`): its
# value is the request's, removed as a known secret wherever it appears.
_CREDENTIAL_HEADER = re.compile(
    r"(?i)^(?:authorization|proxy-authorization|cookie|set-cookie|"
    r"[\w.-]{0,64}?(?:key|token|secret|passw(?:or)?d|pwd|auth|cookie|session|signature|credential)[\w.-]{0,64})$"
)


_REGISTERED_SECRETS: frozenset[str] = frozenset()
_REGISTERED_PATTERNS: tuple[re.Pattern[str], ...] = ()
_REGISTRY_LOCK = threading.Lock()


def register_secret(value: str) -> None:
    """Remove `value` from every failure text this process makes or sends from now on: a secret the
    server holds itself, such as a provider's API key, that a provider's error message may quote.
    A value shorter than 6 characters is refused (`ValueError`): it would shred ordinary words."""
    global _REGISTERED_SECRETS
    if not isinstance(value, str) or len(value) < MIN_KNOWN_SECRET:
        raise ValueError(f"a registered secret is a string of at least {MIN_KNOWN_SECRET} characters")
    with _REGISTRY_LOCK:
        _REGISTERED_SECRETS = _REGISTERED_SECRETS | {value}


def register_secret_pattern(pattern: str | re.Pattern[str]) -> None:
    """Remove every match of `pattern` (a credential shape of your own, say `r"\\bacme_[A-Za-z0-9]{24}"`)
    from every failure text this process makes or sends from now on. Keep it linear: bounded
    repetitions, no nested quantifiers; it runs over every failure's reason."""
    global _REGISTERED_PATTERNS
    compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
    with _REGISTRY_LOCK:
        _REGISTERED_PATTERNS = (*_REGISTERED_PATTERNS, compiled)


def forget_registered_secrets() -> None:
    """Forget every registered secret and pattern (for tests, and a process that changes keys)."""
    global _REGISTERED_SECRETS, _REGISTERED_PATTERNS
    with _REGISTRY_LOCK:
        _REGISTERED_SECRETS, _REGISTERED_PATTERNS = frozenset(), ()


def registered_secrets() -> frozenset[str]:
    """The secrets registered so far (`register_secret`)."""
    return _REGISTERED_SECRETS


def has_registered_secrets() -> bool:
    """Whether the process registered any secret or pattern: then every text that leaves is redacted,
    whatever the request held."""
    return bool(_REGISTERED_SECRETS or _REGISTERED_PATTERNS)


def redact(text: str, known_secrets: Iterable[str] = ()) -> str:
    """`text` without the known and registered secrets and anything shaped like a credential or a
    URL secret."""
    known = {s for s in known_secrets if len(s) >= MIN_KNOWN_SECRET} | _REGISTERED_SECRETS
    if known:
        for secret in sorted(known, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        text = without_a_cut_secret(text, known)
    for registered in _REGISTERED_PATTERNS:
        text = registered.sub(REDACTED, text)
    if not _may_hold_a_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


CUT_MARK = "…"
"""What ends a text cut to its bound (`gym_failures.failures.bounded_text`)."""


def cut_secret_length(text: str, known: Iterable[str]) -> int:
    """How many characters at the end of `text` (cut, ending in the mark) are the first characters of
    a secret the cut went through; 0 when none are.

    The longest such start over every secret wins, whatever order the secrets come in. Only a
    secret's credential part counts (the token of `Bearer <token>`: a cut after the word "Bearer" in
    prose is no secret), two characters at least, so an ordinary last letter is kept. The start may
    follow any character (a token glued to the text before it is still a token): at worst the
    fragment of a word the cut already broke goes, never a whole word."""
    if not text.endswith(CUT_MARK):
        return 0
    body = text[: -len(CUT_MARK)]
    longest = 0
    for token in {secret.rsplit(None, 1)[-1] for secret in known if secret.strip()}:
        for length in range(min(len(token) - 1, len(body)), max(longest, 1), -1):
            if body.endswith(token[:length]):
                longest = length
                break
    return longest


def without_a_cut_secret(text: str, known: Iterable[str]) -> str:
    """`text` (cut, ending in the mark) without the first characters of a secret the cut went
    through (`cut_secret_length`)."""
    length = cut_secret_length(text, known)
    if not length:
        return text
    return text[: -len(CUT_MARK) - length] + REDACTED + CUT_MARK


def url_without_secrets(url: str) -> str:
    """`url` without user info, query string and fragment: the parts that carry tokens."""
    text = re.sub(r"(?i)^([a-z][a-z0-9+.-]*://)[^/?#]*@", r"\1", url)
    for separator in ("?", "#"):
        text = text.split(separator, 1)[0]
    return text


def request_secrets(headers: Iterable[tuple[bytes, bytes]], query_string: bytes) -> list[str]:
    """The secrets an ASGI request carries: credential header values (and their tokens, a Basic
    credential's decoded `user:password` and password, each cookie's value quoted and unquoted) and
    every query value."""
    secrets: list[str] = []
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if not _CREDENTIAL_HEADER.match(name):
            continue
        value = raw_value.decode("latin-1").strip()
        secrets.append(value)
        if name in ("authorization", "proxy-authorization"):
            scheme, _, credential = value.partition(" ")
            secrets.append(credential.strip())  # the credential without its scheme word
            if scheme.lower() == "basic":
                secrets.extend(_basic_secrets(credential.strip()))
        elif name in ("cookie", "set-cookie"):
            for pair in value.split(";"):
                cookie = pair.split("=", 1)[-1].strip()
                secrets.append(cookie)
                if len(cookie) >= 2 and cookie[0] == cookie[-1] == '"':
                    secrets.append(cookie[1:-1])
    if query_string:
        for _, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=False):
            secrets.append(value)
        # A reason quotes the URL as it was sent, percent-encoding and "+" included.
        for part in query_string.split(b"&"):
            raw = part.partition(b"=")[2].decode("latin-1")
            if raw and raw not in secrets:
                secrets.append(raw)
    return secrets


def _basic_secrets(credential: str) -> list[str]:
    """A Basic credential's decoded `user:password` and its password; none when it does not decode."""
    try:
        decoded = base64.b64decode(credential, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return []
    return [decoded, decoded.partition(":")[2]]


def url_secrets(url: str) -> list[str]:
    """The secrets a URL a client calls carries: its user info's password (raw and decoded), the Basic
    credential an HTTP client makes of the user info (`user:password` and its base64), and its query
    values. A collector scrubs its rows of them."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return []
    secrets = []
    if password:
        plain = f"{unquote(user or '')}:{unquote(password)}"
        secrets += [password, unquote(password), plain, base64.b64encode(plain.encode()).decode()]
    secrets += [value for _, value in parse_qsl(parts.query)]
    return [secret for secret in secrets if len(secret) >= MIN_KNOWN_SECRET]


# Deeper than this, a structure's strings are scrubbed through its JSON text: no real row nests so deep,
# and recursion must not be what a hostile reply controls.
_MAX_DEPTH = 64


def redact_values(value: Any, secrets: Sequence[str], _depth: int = 0) -> Any:
    """`value` (a row, a reply body: dicts, lists and scalars) with each of `secrets`, each registered
    secret and each match of a registered pattern replaced in every string in it, keys left as they
    are. Only these are replaced, never the built-in credential shapes: the rest of a row (a policy's
    answer) is data, and stays as it was."""
    known = sorted(
        {secret for secret in secrets if len(secret) >= MIN_KNOWN_SECRET} | _REGISTERED_SECRETS,
        key=len,
        reverse=True,
    )
    if not known and not _REGISTERED_PATTERNS:
        return value
    return _replaced(value, known, _REGISTERED_PATTERNS, _depth)


def _replaced(value: Any, known: list[str], patterns: tuple[re.Pattern[str], ...], depth: int) -> Any:
    if isinstance(value, str):
        for secret in known:
            value = value.replace(secret, REDACTED)
        for pattern in patterns:
            value = pattern.sub(REDACTED, value)
        return value
    if depth >= _MAX_DEPTH and isinstance(value, dict | list):
        text = json.dumps(value)
        for secret in known:
            # As the secret is written inside a JSON string: a quote or backslash in it is escaped.
            text = text.replace(json.dumps(secret)[1:-1], REDACTED)
        return json.loads(text)
    if isinstance(value, dict):
        return {key: _replaced(item, known, patterns, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, known, patterns, depth + 1) for item in value]
    return value
