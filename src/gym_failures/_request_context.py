"""The request being served, as a record sees it: the ContextVar its failure log lives in, and the
request's own credentials scrubbed from a text.

A record's free text (`EpisodeFailure.failure_reason`, a `FailureEvent`'s reason and operation, an
`SdkErrorDetails` message, a sandbox's `provider_status_reason`) may quote the request it was made in:
`EpisodeFailure(failure_reason=f"token {token} refused")` in a handler. `gym_failures.reply` scrubs
every report that leaves through it, but an app that serializes a record itself
(`BaseEpisodeResponse(...).model_dump()` returned as the body) never passes there. So the records
scrub themselves when they are serialized (`model_dump`, `model_dump_json`, FastAPI's response
encoding; a `model_construct` or `model_copy(update=...)` too, which skip validation), and the
records an app writes by hand (`EpisodeFailure`, `SdkErrorDetails`, `SandboxFailureDetails`) and a
failure it raises (`NgFailureEvent`) when they are made, so that their texts are safe to log as well.
A `FailureEvent` is scrubbed only when serialized: a server decodes one from every header it reads,
and a validator on it would cost every decode (about 0.3 µs an event). Inside a request,
every text loses the request's own credential values (`RequestFailureLog.request_secrets`: its
credential headers, cookies, Basic credentials and query values); everywhere, the secrets and
patterns the process registered (`gym_failures.redaction.register_secret`).

The log's ContextVar lives here, below the records, so that a record reads the request without
importing the log's module (which builds on the records); `gym_failures._request_log` types it
exactly and re-exports it. What a record needs of the log is one method (`RequestCredentials`).

Decisions:
- A record's text loses the known values only (the request's credentials, the registered secrets
  and patterns, and the first characters of one a cut went through: `known_values_removed`), and is
  cut to its field's bound again when a marker made it longer; the built-in credential shapes are
  the reply helpers' (`scrub_text`, which `gym_failures.reply.scrub` uses) and the producer's
  (`NgFailureEvent` redacts its texts where it is made). A record is data: outside a server, with
  nothing registered, it stays exactly as it was. Serializing runs `str.replace` per known value
  over each text, never the credential patterns (a report is serialized more than once a reply:
  fitted, then encoded).
- A result (`BaseEpisodeResponse.result`) is the episode's outcome, data like a row's: it is not
  scrubbed, as `gym_failures.reply.episode_response` never scrubbed it.
- The cost is one ContextVar read per record outside a request, with nothing registered; a
  request's credentials are read from its scope once (`RequestFailureLog.known_secrets`). The success
  path of the middleware makes no record and pays nothing.
- What the records cannot see they cannot scrub: a body built from another library's models (NeMo
  Gym's own `nemo_gym.episode_types.EpisodeFailure`) or from plain dicts leaves as the app wrote it.
  Scrubbing every JSON body in the middleware would cover those, at the price of holding back each
  reply's start until its body is seen (to fix its `content-length`) on every request; see
  docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Protocol

from gym_failures.redaction import (
    CUT_MARK,
    cut_secret_length,
    has_registered_secrets,
    redact,
    redact_values,
    registered_secrets,
    without_a_cut_secret,
)

__all__ = [
    "CURRENT_REQUEST_LOG",
    "RequestCredentials",
    "current_request_secrets",
    "known_values_removed",
    "scrub_in_request",
    "scrub_text",
]


class RequestCredentials(Protocol):
    """What a record needs of the request being served: its own credential values."""

    def request_secrets(self) -> list[str]: ...


CURRENT_REQUEST_LOG: ContextVar[RequestCredentials | None] = ContextVar(
    "ng_request_failure_log", default=None
)
"""The failure log of the request being served; `None` outside a Gym server request. Typed exactly
(`RequestFailureLog`) by `gym_failures._request_log`, which sets it."""


def current_request_secrets() -> list[str]:
    """The credential values of the request being served; none outside a request."""
    log = CURRENT_REQUEST_LOG.get()
    return [] if log is None else log.request_secrets()


def scrub_text(text: str, secrets: Sequence[str], bound: int, *, registered: bool | None = None) -> str:
    """`text` without any of `secrets`, any registered secret or any match of a registered pattern
    (and then without the built-in credential shapes, `redact`), cut to `bound` again when the
    markers made it longer; `text` itself when none is there: what a report leaving a server gets
    (`gym_failures.reply.scrub`). `registered`: whether anything is registered, when the caller
    already asked (`has_registered_secrets`)."""
    if registered is None:
        registered = has_registered_secrets()
    held = any(secret in text for secret in secrets) or cut_secret_length(text, secrets)
    if not registered and not held:
        return text
    redacted = redact(text, secrets)
    if redacted == text:
        return text
    # The marker can be longer than the secret it replaces.
    return redacted if len(redacted) <= bound else redacted[: bound - 1] + CUT_MARK


def known_values_removed(text: str, secrets: Sequence[str], bound: int) -> str:
    """`text` without any of `secrets`, any registered secret or any match of a registered pattern,
    a secret the cut went through included, cut to `bound` again: what a record's text gets (the
    built-in credential shapes are left to the reply helpers: a record is data)."""
    removed: str = without_a_cut_secret(redact_values(text, secrets), [*secrets, *registered_secrets()])
    if removed == text:
        return text
    return removed if len(removed) <= bound else removed[: bound - 1] + CUT_MARK


def secrets_to_scrub() -> tuple[list[str], bool] | None:
    """What a record made or serialized now must remove: the current request's credentials and
    whether the process registered secrets; `None` when there is nothing to remove (outside a request,
    nothing registered), which is the common case and costs one ContextVar read."""
    log = CURRENT_REQUEST_LOG.get()
    registered = has_registered_secrets()
    if log is None:
        return ([], True) if registered else None
    secrets = log.request_secrets()
    return (secrets, registered) if secrets or registered else None


def scrub_in_request(text: str, bound: int) -> str:
    """`text` without the current request's credentials and the registered secrets
    (`known_values_removed`): what a record does to each of its free texts when it is made and when
    it is serialized."""
    found = secrets_to_scrub()
    return text if found is None else known_values_removed(text, found[0], bound)
