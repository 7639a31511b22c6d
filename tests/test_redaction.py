"""Tests for redaction: credential patterns, known secrets, request secrets and URL secrets."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_failures.redaction import REDACTED, redact, request_secrets, url_without_secrets

# --- Patterns -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "GET https://alice:s3cret@api.example.com/v1 failed",
            f"GET https://{REDACTED}@api.example.com/v1 failed",
            id="url_user_info",
        ),
        pytest.param("ftp://alice@files.example/x", f"ftp://{REDACTED}@files.example/x", id="url_user_only"),
        pytest.param(
            "GET https://api.example.com/v1?api_key=abc123&page=2 failed",
            f"GET https://api.example.com/v1?api_key={REDACTED}&page=2 failed",
            id="url_query",
        ),
        pytest.param(
            "see http://h/p?sig=1a2b#top",
            f"see http://h/p?sig={REDACTED}#top",
            id="url_query_before_fragment",
        ),
        pytest.param("see http://h/p#top?x", "see http://h/p#top?x", id="url_question_mark_in_fragment"),
        pytest.param(
            'url="https://h/cb?code=xyz789"',
            f'url="https://h/cb?code={REDACTED}"',
            id="url_query_in_quotes",
        ),
        pytest.param(
            "go to https://h/r?next=https://x/y?token=t0k3n",
            f"go to https://h/r?next=https://x/y?token={REDACTED}",
            id="url_nested_in_query",
        ),
        pytest.param("sent Bearer eyJhbGciOi.J9pay.load", f"sent Bearer {REDACTED}", id="bearer"),
        pytest.param("sent bearer\teyJhbGciOiJ9", f"sent bearer {REDACTED}", id="bearer_lower_tab"),
        pytest.param("used Basic dXNlcjpwYXNz for login", f"used Basic {REDACTED} for login", id="basic"),
        # `echo user:pw | base64` (no -n) encodes the newline: "user:pw\n", quoted back by a 401.
        pytest.param("401 (sent Basic dXNlcjpwdwo=)", f"401 (sent Basic {REDACTED})", id="basic_newline"),
        pytest.param("sent Basic dXNlcjoNCg==", f"sent Basic {REDACTED}", id="basic_crlf"),
        pytest.param("refused Basic dXNlcjpwYXNz.", f"refused Basic {REDACTED}.", id="basic_full_stop"),
        pytest.param("sent Bearer eyJhbGciOiJ9.", f"sent Bearer {REDACTED}.", id="bearer_full_stop"),
        pytest.param("Token abcd1234 rejected", f"Token {REDACTED} rejected", id="token_scheme"),
        pytest.param("key sk-proj-AbCdEf0123456789 rejected", f"key {REDACTED} rejected", id="sk"),
        pytest.param("slack xoxb-1234-5678-abcdef posted", f"slack {REDACTED} posted", id="xox"),
        pytest.param("github ghp_0123456789abcdefABCDEF used", f"github {REDACTED} used", id="ghp"),
        pytest.param("aws AKIAIOSFODNN7EXAMPLE denied", f"aws {REDACTED} denied", id="akia"),
        pytest.param("api_key=abc123 page=2", f"api_key={REDACTED} page=2", id="name_equals_value"),
        pytest.param(
            "password: hunter22, user: bob", f"password: {REDACTED}, user: bob", id="name_colon_value"
        ),
        pytest.param("X-Api-Key: k1k2k3k4", f"X-Api-Key: {REDACTED}", id="header_line"),
        pytest.param("session=abcdef; path=/", f"session={REDACTED}; path=/", id="cookie_pair"),
        pytest.param(
            '{"access_token": "tok value 1", "model": "m"}',
            f'{{"access_token": {REDACTED}, "model": "m"}}',
            id="json_pair",
        ),
        pytest.param("{'client_secret': 'x y'}", f"{{'client_secret': {REDACTED}}}", id="python_repr_pair"),
        pytest.param(
            "Authorization: Bearer abcdefgh", f"Authorization: {REDACTED} {REDACTED}", id="auth_header"
        ),
    ],
)
def test_credential_shapes_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "model_server_error: the provider answered 503 after 2.5 s",
        "a Bearer in the woods",
        "risk-assessment and task-1234567 finished",
        "AKIA1234 is too short for a key id",
        "see http://h/p and https://h/q/r for details",
        "ratio=0.5 temperature: 0.7",
    ],
)
def test_text_without_credentials_is_unchanged(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "password: hunter22",
        "Authorization: Bearer abcdefgh",
        '{"token": "abc"}',
        "https://u:p@h/p?x=1",
        "key sk-proj-AbCdEf0123456789",
    ],
)
def test_redacting_twice_changes_nothing(text: str) -> None:
    """Every hop may redact again: the marker must not grow ("[REDACTED]]")."""
    once = redact(text)
    assert redact(once) == once


# --- Known secrets ------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["correct horse battery", "äöü-ß-€", "123456", "x" * 300])
def test_a_known_secret_is_removed_whatever_its_shape(secret: str) -> None:
    assert redact(f"<{secret}> and again {secret}.", [secret]) == f"<{REDACTED}> and again {REDACTED}."


def test_a_known_secret_shorter_than_six_characters_is_kept() -> None:
    assert redact("page 12345 of 99999", ["12345", "99999"]) == "page 12345 of 99999"


def test_a_longer_known_secret_is_removed_before_its_prefix() -> None:
    assert redact("value abcdefgh end", ["abcdef", "abcdefgh"]) == f"value {REDACTED} end"


def test_known_secrets_may_be_any_iterable() -> None:
    assert redact("one secret-one", (s for s in ["secret-one"])) == f"one {REDACTED}"


# --- Request secrets ----------------------------------------------------------------------------


def test_request_secrets_take_the_authorization_value_and_its_credential() -> None:
    secrets = request_secrets([(b"authorization", b"Custom Zq9Credential")], b"")
    assert secrets == ["Custom Zq9Credential", "Zq9Credential"]


def test_request_secrets_take_each_cookie_value() -> None:
    secrets = request_secrets([(b"cookie", b"sid=abcdef123; theme=dark")], b"")
    assert "abcdef123" in secrets
    assert "dark" in secrets


@pytest.mark.parametrize(
    "name", [b"Authorization", b"proxy-authorization", b"x-api-key", b"x-auth-token", b"set-cookie"]
)
def test_request_secrets_take_credential_headers(name: bytes) -> None:
    assert "Hv7HeaderValue" in " ".join(request_secrets([(name, b"Hv7HeaderValue")], b""))


@pytest.mark.parametrize("name", [b"accept", b"user-agent", b"content-type", b"x-request-id"])
def test_request_secrets_skip_other_headers(name: bytes) -> None:
    assert request_secrets([(name, b"Hv7HeaderValue")], b"") == []


def test_request_secrets_take_every_query_value() -> None:
    secrets = request_secrets([], b"page=2&token=zzz&empty=&q=hello+world&x=a%2Fb")
    # Decoded values first, then the raw forms a reason quoting the URL would hold.
    assert secrets == ["2", "zzz", "hello world", "a/b", "hello+world", "a%2Fb"]


def test_request_secrets_remove_a_request_s_values_from_text() -> None:
    secrets = request_secrets([(b"authorization", b"Custom Zq9Credential")], b"session_name=Qx7QueryValue")
    text = "refused Zq9Credential for Qx7QueryValue"
    assert redact(text, secrets) == f"refused {REDACTED} for {REDACTED}"


# --- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://u:p@h.example:8080/a/b?x=1#f", "https://h.example:8080/a/b"),
        ("HTTPS://user@h.example/", "HTTPS://h.example/"),
        ("http://h.example/a#f?x", "http://h.example/a"),
        ("http://h.example/a", "http://h.example/a"),
        ("/relative/path?token=x", "/relative/path"),
    ],
)
def test_url_without_secrets_drops_user_info_query_and_fragment(url: str, expected: str) -> None:
    assert url_without_secrets(url) == expected


# --- Properties ---------------------------------------------------------------------------------

# Pieces of the shapes the patterns look for, so random text reaches their edges.
FRAGMENTS = [
    "http://",
    "a://",
    "?",
    "#",
    "@",
    ":",
    "=",
    " ",
    "\t",
    '"',
    "'",
    "}",
    "]",
    ";",
    "&",
    "key",
    "token",
    "Bearer ",
    "sk-",
    "ghp_",
    "xoxb-",
    "AKIA",
    "ABCDEFGHIJKLMNOP",
    "0123456789",
    REDACTED,
]
texts = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=24).map("".join),
)
# A secret without the marker's characters or whitespace: a secret made of them can reappear from the
# marker itself ("[REDACTED]" holds "EDACTE") or from a pattern's single space, which is no leak.
# The inputs are small, so the per-example deadline measures only how busy the machine is.
no_deadline = settings(deadline=None)
secrets = st.text(
    alphabet=st.characters(exclude_categories=("Z", "C"), exclude_characters=REDACTED),
    min_size=6,
    max_size=40,
)


@no_deadline
@given(texts, st.lists(st.text(), max_size=4))
def test_redact_never_raises(text: str, known: list[str]) -> None:
    assert isinstance(redact(text, known), str)


@no_deadline
@given(texts, secrets, texts, texts)
def test_a_known_secret_never_survives(prefix: str, secret: str, middle: str, suffix: str) -> None:
    text = prefix + secret + middle + secret + suffix
    assert secret not in redact(text, [secret])


@no_deadline
@given(texts)
def test_redacting_again_never_grows_the_text(text: str) -> None:
    """Each hop redacts again: a second pass may find more (a pattern can match only once a later one
    has replaced text), but never rewrites a marker into a longer one."""
    once = redact(text)
    assert len(redact(once)) <= len(once)


# --- Adversarial input --------------------------------------------------------------------------

# Each repeats a pattern's prefix without its end, the shape that makes a backtracking pattern
# rescan the rest of the text from every start. The suite's run time is the check (no timed assertion).
ADVERSARIAL_UNITS = ["a://", "_a://", "token://=", "key=", '"token": "', "bearer ", "sk-", "a:", "-", " "]


@pytest.mark.parametrize("unit", ADVERSARIAL_UNITS)
def test_redact_handles_200_kb_of_adversarial_text(unit: str) -> None:
    text = unit * (200_000 // len(unit))
    assert isinstance(redact(text), str)


def test_a_200_kb_run_of_schemes_without_a_query_is_left_as_is() -> None:
    text = "a://" * 50_000
    assert redact(text) == text


def test_a_raw_at_sign_in_a_password_does_not_leak_its_tail() -> None:
    assert url_without_secrets("https://user:p@ss@host/v1?x=1") == "https://host/v1"
    assert "ss@host" not in redact("GET https://user:p@ss@host/v1").replace(f"{REDACTED}@host", "")


@pytest.mark.parametrize(
    "secret",
    [
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "hf_abcdefghijklmnopqrstuvwxyz",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefgh12",
    ],
    ids=["google", "huggingface", "jwt"],
)
def test_more_key_shapes_are_removed(secret: str) -> None:
    assert secret not in redact(f"the provider said: {secret} is invalid")


def test_raw_query_values_are_known_secrets_too() -> None:
    secrets = request_secrets([], b"sig=Zm9v%2Bbar&code=ab+cd")
    assert "Zm9v%2Bbar" in secrets
    assert "ab+cd" in secrets


# --- Issue 14: provider keys, registered secrets, cut secrets, request credentials ---------------

from gym_failures.failures import bounded_text  # noqa: E402
from gym_failures.redaction import (  # noqa: E402 (grouped with the tests that use them)
    forget_registered_secrets,
    register_secret,
    register_secret_pattern,
    url_secrets,
)


@pytest.fixture
def registry() -> Iterator[None]:
    forget_registered_secrets()
    yield None
    forget_registered_secrets()


GROQ, XAI = "gsk_" + "A1b2C3d4" * 4, "xai-" + "Q9w8E7r6" * 4
HEX64, OTHER = "0123456789abcdef" * 4, "Zx81Kq02Lm" * 2


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"groq said: invalid key {GROQ}", GROQ),
        (f"{XAI} was refused", XAI),
        (f"Incorrect API key provided: {HEX64}. You can find your key at ...", HEX64),
        (f"invalid api key {HEX64}", HEX64),
        (f"invalid_api_key: {OTHER}", OTHER),
        ("stripe refused sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
        ("webhook secret whsec_test_" + "Zq9Kx81mNw02Lp", "Zq9Kx81mNw02Lp"),
    ],
)
def test_provider_keys_quoted_by_a_provider_are_redacted(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert REDACTED in redact(text)


def test_a_registered_secret_is_removed_from_every_text(registry: None) -> None:
    key = "plain-looking-provider-key-42"
    assert key in redact(f"provider refused {key}")
    register_secret(key)
    assert redact(f"provider refused {key}") == f"provider refused {REDACTED}"


def test_a_registered_pattern_is_removed_from_every_text(registry: None) -> None:
    register_secret_pattern(r"\bacme_[A-Za-z0-9]{12}\b")
    assert redact("key acme_ABCDEF123456 refused") == f"key {REDACTED} refused"


@pytest.mark.parametrize("value", ["", "short", 42])
def test_a_secret_too_short_to_register_is_refused(value: object, registry: None) -> None:
    with pytest.raises(ValueError, match="at least 6 characters"):
        register_secret(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("kept", [2, 5, 11])
def test_the_first_characters_of_a_secret_cut_at_the_bound_are_removed(kept: int) -> None:
    secret = "Zq9CanarySecretValue"
    text = bounded_text("x" * (2000 - 1 - kept) + secret + " tail")
    assert text.endswith(secret[:kept] + "…")

    redacted = redact(text, [secret])

    assert secret[:kept] not in redacted[-kept - 20 :]
    assert redacted.endswith(REDACTED + "…")


def test_a_text_cut_after_an_ordinary_letter_keeps_it() -> None:
    text = bounded_text("x" * 2100)
    assert redact(text, ["xylophone-secret"]) == text


def test_request_secrets_take_a_quoted_cookie_value_unquoted() -> None:
    secrets = request_secrets([(b"cookie", b'sid="Zq9CookieSecret"; theme=dark')], b"")
    assert "Zq9CookieSecret" in secrets


def test_request_secrets_take_a_basic_credentials_decoded_password() -> None:
    import base64

    token = base64.b64encode(b"alice:Zq9BasicPassword").decode()
    secrets = request_secrets([(b"authorization", f"Basic {token}".encode())], b"")
    assert {"alice:Zq9BasicPassword", "Zq9BasicPassword", token} <= set(secrets)


def test_a_requests_short_basic_credential_is_removed_though_prose_would_keep_it() -> None:
    # "YTpi" (a:b) is too short to be taken for a credential in prose; the request's own header value
    # is known (its bare four characters are below MIN_KNOWN_SECRET, as every known value that short).
    assert redact("refused: Basic YTpi") == "refused: Basic YTpi"
    secrets = request_secrets([(b"authorization", b"Basic YTpi")], b"")
    assert redact("refused: Basic YTpi", secrets) == f"refused: {REDACTED}"


def test_request_secrets_skip_a_basic_credential_that_does_not_decode() -> None:
    secrets = request_secrets([(b"authorization", b"Basic %%%not-base64")], b"")
    assert secrets == ["Basic %%%not-base64", "%%%not-base64"]


def test_url_secrets_are_the_password_raw_and_decoded_and_query_values() -> None:
    secrets = url_secrets("http://user:Zq9%40Password@agent.local:8000/run?token=Zq9QueryValue&x=1")
    basic = base64.b64encode(b"user:Zq9@Password").decode()
    assert secrets == ["Zq9%40Password", "Zq9@Password", "user:Zq9@Password", basic, "Zq9QueryValue"]
    assert url_secrets("http://[bad") == []
