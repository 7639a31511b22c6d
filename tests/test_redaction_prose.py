"""Redaction never eats ordinary words (issue 23): a message a person reads keeps every word that is
not a secret. A word after `Bearer`, `Token` or "API key:" is removed only when it has a credential's
shape; a `name=value` pair (a URL's query parameter among them) only when its name is a secret name,
by whole words. Every real credential shape is still removed (the canaries below)."""

from __future__ import annotations

import ast
import base64
import string
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gym_failures.redaction import (
    REDACTED,
    SECRET_NAME_WORDS,
    is_secret_name,
    looks_like_credential,
    name_words,
    redact,
)

# Realistic shapes, none of them a live key.
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
CANARIES = [
    "sk-proj-Zq9mX2vB7nL4kP0wR8tY",
    "sk-ant-api03-Zq9mX2vB7nL4kP0wR8tYabcdef",
    "ghp_Zq9mX2vB7nL4kP0wR8tYcD3fG5hJ1kL",
    "github_pat_11AAAAAAA0Zq9mX2vB7nL4kP0wR8tY",
    "glpat-Zq9mX2vB7nL4kP0wR8tY",
    "AKIAZQ9MX2VB7NL4KP0W",
    "hf_Zq9mX2vB7nL4kP0wR8tYcD3fG5hJ",
    "xoxb-1234567890-Zq9mX2vB7nL4",
    JWT,
    "3f9a7c2e1b8d4f6a0c5e9b2d7f1a3c8e",  # a bare hex key
    "Zq9mX2vB7nL4kP0wR8tY",  # an opaque token
]
PHRASES = [
    "Authorization: Bearer {secret}",
    "sent Bearer {secret} to the model",
    "Token {secret} was rejected",
    "Incorrect API key provided: {secret}. You can find your key at ...",
    "no valid API key: {secret}",
    "api_key={secret}&page=2",
    'config {{"openai_api_key": "{secret}"}}',
    "X-Api-Key: {secret}",
    "token: {secret}",
    "GET https://api.example.com/v1/items?page=2&access_token={secret} failed",
    "callback https://h/cb?code={secret}&state=ok",
    "password={secret}",
]


@pytest.mark.parametrize("phrase", PHRASES)
@pytest.mark.parametrize("secret", CANARIES)
def test_every_real_credential_shape_is_still_removed(phrase: str, secret: str) -> None:
    text = phrase.format(secret=secret)
    redacted = redact(text)
    assert secret not in redacted
    assert redact(redacted) == redacted


@pytest.mark.parametrize("secret", CANARIES)
def test_the_canaries_look_like_credentials(secret: str) -> None:
    assert looks_like_credential(secret)


def test_a_basic_credential_is_removed_whatever_its_letters() -> None:
    credential = base64.b64encode(b"alice:correcthorse").decode()
    assert redact(f"used Basic {credential} for login") == f"used Basic {REDACTED} for login"


# Ordinary failure reasons, the project's own among them: every word survives.
PROSE = [
    "no valid API key: send it as a Bearer token or in x-api-key",
    "the token budget ran out",
    "max_tokens=4096 token limit",
    "GET https://api.example.com/v1/items?page=2&sort=asc failed",
    "judge gpt-4o-mini answered 503",
    "Bearer token missing: the server expects an Authorization header",
    "the API key is missing or malformed",
    "session expired; log in again",
    "token: expired",
    "key: value pairs are read from the config",
    "author=nvidia_team tokenizer_model=gpt-4o output_token_policy=remaining_context",
    "the tokenizer could not encode 12 tokens",
    "basic validation failed for field 'prompt'",
    "a Basic example of the digest format",
    "retry after 30 s: rate limit of 60000 tokens per minute reached",
    "context length 128000 exceeded by max_output_tokens=2048",
    "keyboard interrupt: the collector stopped",
    "signature verification skipped for local runs",
]


@pytest.mark.parametrize("text", PROSE)
def test_ordinary_failure_reasons_come_out_unchanged(text: str) -> None:
    assert redact(text) == text


MESSAGE_ARGUMENTS = {"failure_reason", "reason", "message", "detail"}


def _the_projects_own_messages() -> list[tuple[str, str]]:
    """Every message the package writes for a person to read, read out of its source: the text of a
    `failure_reason=`, `reason=`, `message=` or `detail=` argument and of a raised exception's first
    argument, an f-string's fields filled with a number."""
    source = Path(__file__).resolve().parents[1] / "src" / "gym_failures"
    messages = []
    for path in sorted(source.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg in MESSAGE_ARGUMENTS:
                value: ast.expr | None = node.value
            elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                value = node.exc.args[0]
            else:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                text = value.value
            elif isinstance(value, ast.JoinedStr):
                parts = value.values
                text = "".join(str(part.value) if isinstance(part, ast.Constant) else "42" for part in parts)
            else:
                continue
            if len(text.split()) >= 3:
                messages.append((f"{path.relative_to(source)}:{value.lineno}", text))
    return messages


PROJECT_MESSAGES = _the_projects_own_messages()


def test_the_corpus_of_the_projects_own_messages_is_read() -> None:
    # Over 200 when written: a reader that found none would make the test below pass vacuously.
    assert len(PROJECT_MESSAGES) >= 150


@pytest.mark.parametrize(("where", "text"), PROJECT_MESSAGES, ids=[where for where, _ in PROJECT_MESSAGES])
def test_the_projects_own_messages_come_out_unchanged(where: str, text: str) -> None:
    assert redact(text) == text


_WORDS = st.text(string.ascii_lowercase, min_size=1, max_size=12)


@given(st.lists(_WORDS, min_size=1, max_size=12))
@example(["ajoa"])  # base64 of "j:\x1a", once taken for a Basic credential
@example(["ajpaajpa"])  # base64 of the printable "j:Zj:Z"
def test_ordinary_english_words_survive_after_any_scheme_word(words: list[str]) -> None:
    """Lower-case words (shorter than a credential) survive, wherever `Bearer`, `token` or "API key:"
    stands among them."""
    for lead in ("Bearer", "token", "Token", "API key:", "api key", "key:", "Basic", "digest"):
        text = " ".join([lead, *words])
        assert redact(text) == text


# A query parameter is a secret by one more name, OAuth's one-time `code` (`redaction.py`).
_NAMES = st.text(string.ascii_lowercase + "_", min_size=1, max_size=16).filter(
    lambda name: not is_secret_name(name, more_words=("code",))
)
_VALUES = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=16).filter(
    lambda value: not looks_like_credential(value)
)


@given(st.lists(st.tuples(_NAMES, _VALUES), min_size=1, max_size=6))
def test_pairs_with_non_secret_names_survive(pairs: list[tuple[str, str]]) -> None:
    for separator, joiner in (("=", " "), ("=", "&"), (": ", ", ")):
        text = joiner.join(f"{name}{separator}{value}" for name, value in pairs)
        assert redact(text) == text
    query = "&".join(f"{name}={value}" for name, value in pairs)
    assert redact(f"GET https://h/p?{query} failed") == f"GET https://h/p?{query} failed"


@given(st.sampled_from(sorted(SECRET_NAME_WORDS)), _NAMES, _VALUES)
def test_a_secret_named_pair_loses_its_value(word: str, prefix: str, value: str) -> None:
    name = f"{prefix}_{word}"
    assert redact(f"{name}={value}") == f"{name}={REDACTED}"
    assert redact(f"https://h/p?{name}={value}") == f"https://h/p?{name}={REDACTED}"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("X-Api-Key", ["x", "api", "key"]),
        ("apiKey", ["api", "key"]),
        ("APIKey", ["api", "key"]),
        ("openai.api_key", ["openai", "api", "key"]),
        ("tokenizer_model", ["tokenizer", "model"]),
        ("max_tokens", ["max", "tokens"]),
    ],
)
def test_name_words_split_on_separators_and_camel_case(name: str, words: list[str]) -> None:
    assert name_words(name) == words


@pytest.mark.parametrize("name", ["author", "monkey", "tokenizer_model", "max_tokens", "keyboard", "page"])
def test_substrings_of_secret_words_are_no_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_urls_nested_in_queries_200_kb_deep_are_read_in_one_pass() -> None:
    text = "https://h/p?next=" * 12_000 + "https://x/y?token=Zq9mX2vB7nL4kP0wR8tY"
    assert redact(text) == text.replace("Zq9mX2vB7nL4kP0wR8tY", REDACTED)
