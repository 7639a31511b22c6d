"""The bounds on a failure's text: made writable as UTF-8, redacted, and cut to its field's limit.

Every text a failure carries passes through here before it becomes part of an event: `safe_text`
escapes lone surrogates, `bounded_text` cuts to a limit (marked "…"), `bounded_reason` redacts first
(`gym_failures.redaction.redact`), so a credential or URL secret quoted by a producer never reaches a
header, a row or a log. Documented, and reached, as `gym_failures.failures.safe_text`,
`...bounded_text` and `...exception_type_name`.

Decisions (see also `gym_failures.failures`):
- A reason longer than 2000 characters is cut to 2000 (ending in "…") rather than refused: the
  failure matters more than its prose.
- A text decoded with `surrogateescape` (a tool's stderr often is) is kept, its lone surrogates
  escaped (`\\udcff`), rather than refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_failures._request_context import current_request_secrets
from gym_failures.failure_records import FailureDetails
from gym_failures.redaction import CUT_MARK, redact

MAX_REASON = 2000
"""The longest reason (and selected SDK message) an event keeps, in characters."""
MAX_NAME = 256
"""The longest name (an exception type, an operation, a provider) an event keeps, in characters."""


def safe_text(text: str) -> str:
    """`text` with every lone surrogate escaped (`\\udcff`): text decoded with `surrogateescape`, as a
    tool's stderr often is, cannot be written as UTF-8, and a JSON reader may refuse its escape. The
    failure matters more than its bytes, so the text is kept, escaped, rather than refused."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def bounded_text(text: str, limit: int = MAX_REASON) -> str:
    """`text` made safe (`safe_text`) and cut to at most `limit` characters, the cut marked with "…"."""
    text = safe_text(text)
    return text if len(text) <= limit else text[: limit - 1] + CUT_MARK


def bounded_reason(text: str, limit: int = MAX_REASON) -> str:
    """`text` redacted, made safe and cut to `limit`: what every free-text field of an event holds."""
    # Redact before cutting, so a cut never leaves half a secret; pre-cut so redaction stays cheap,
    # the pre-cut marked, so that a secret it went through loses its first characters too (`redact`).
    # Inside a request, its own credential values go too (`gym_failures._request_context`).
    if len(text) > 4 * limit:
        text = text[: 4 * limit - 1] + CUT_MARK
    return bounded_text(redact(text, current_request_secrets()), limit)


def exception_type_name(error: BaseException | type[BaseException]) -> str:
    """The type of `error` as an event records it: `ValueError` for a builtin, else
    `module.QualifiedName`, cut to 256 characters. Never its text."""
    cls = error if isinstance(error, type) else type(error)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return bounded_text(name, MAX_NAME)


# The text fields of the details schemas and their bounds: cut (and the free-text one redacted)
# rather than refused, so a long provider message never replaces the failure with a ValidationError.
_DETAIL_TEXTS = {
    "execution_id": MAX_NAME,
    "provider": MAX_NAME,
    "sandbox_id": MAX_NAME,
    "provider_request_id": MAX_NAME,
}


def bounded_details(details: FailureDetails | Mapping[str, Any] | None) -> Any:
    """`details` with its text fields cut to their bounds and `provider_status_reason` redacted."""
    if details is None:
        return None
    if isinstance(details, Mapping):
        bounded = dict(details)
        for name, limit in _DETAIL_TEXTS.items():
            if isinstance(bounded.get(name), str):
                bounded[name] = bounded_text(bounded[name], limit)
        if isinstance(bounded.get("provider_status_reason"), str):
            bounded["provider_status_reason"] = bounded_reason(bounded["provider_status_reason"])
        return bounded
    reason = getattr(details, "provider_status_reason", None)
    if isinstance(reason, str) and bounded_reason(reason) != reason:
        return details.model_copy(update={"provider_status_reason": bounded_reason(reason)})
    return details
