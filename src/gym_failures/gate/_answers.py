"""Answer parsing: a success row's answer and verification, and the rules that derive a gate class.

The gate-derived kinds (`truncated_answer`, `empty_answer`, `malformed_answer`,
`grading_without_verdict`) are found here; `gym_failures.gate._coverage` counts them.

Success-row contract (what the default rules read from a success row's `result`):

- `result["reward"]`: a float, or None.
- `result["response"]`: the policy's final response, either
  - an OpenAI Responses object: `status` (`"completed"`, `"incomplete"`, ...),
    `incomplete_details.reason` (`"max_output_tokens"`, ...), and `output`, a list of items whose
    `message` items hold `content` parts; the parts of type `output_text` carry the answer in `text`.
    A top-level `output_text` string (the SDK's own join of those parts) is accepted when the items
    hold no text; or
  - a chat completion: `choices[0].finish_reason` (`"stop"`, `"length"`, ...) and
    `choices[0].message.content` (a string, or a list of parts with `text`).
  - an Anthropic message: `type` `"message"`, `stop_reason` (`"end_turn"`, `"max_tokens"`, ...) and
    `content`, a list of blocks whose `text` blocks carry the answer; or
  - the answer's text itself, a string: an agent that returns what its model said. Its reply's
    finish reason then travels beside it, in `result["finish_reason"]` (or `result["stop_reason"]`),
    as the API named it (`"length"`, `"max_tokens"`, `"max_output_tokens"` mean the token limit).
  A result without a response in any of these shapes gives the answer rules no evidence: they return
  None, and only the verification is judged.
- `result["verification"]`: the verifier's account, optional (a NeMo Gym completed row has none:
  its `reward` is the measurement, see `has_verdict`), a mapping with `verdict` (a bool, a number or a
  non-empty string; None or absent when no verdict was reached) and, for a verifier that extracts
  answers, `extracted_answer` (the extracted text, or None when extraction failed; a verifier that
  does not extract leaves the key out).

Rules (`DEFAULT_RULES`, in this order; the first that returns a kind wins):

1. `truncated_answer`: a Responses object with status `incomplete` and reason `max_output_tokens`,
   a chat `finish_reason` of `length`, an Anthropic `stop_reason` of `max_tokens`, or a text answer
   whose finish reason is one of `TRUNCATION_REASONS`.
2. `empty_answer`: a response with no final output text (whitespace only counts as none), a text
   answer `""` or whitespace included.
3. `malformed_answer`: a verification with `extracted_answer` None while the output text is not empty.
4. `grading_without_verdict`: no measurement: a verification whose verdict is None (or absent), or,
   without a verification, no finite `reward` (None, missing, NaN).

The order puts cause before symptom, following the pipeline (generation, extraction, grading): an
answer cut off by the token limit is often empty (reasoning used the budget) and cannot be parsed; an
empty answer leaves nothing to extract; and a verifier handed no answer returns no verdict. Reporting
the earliest fault names the policy's own behaviour (model-side) rather than its evaluation-side
symptom, which would otherwise be blamed on the grader. A rule is any callable from a row to a kind
or None; pass your own list to replace or extend these (for an environment whose `reward` is its
verdict and that saves a verification anyway, for instance, drop `grading_without_verdict`).

A row is read, never trusted: a value of the wrong type (a list where a string belongs, a number for
a mapping) is no evidence, and no row makes the gate raise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gym_failures.failure_kinds import (
    EMPTY_ANSWER,
    GRADING_WITHOUT_VERDICT,
    MALFORMED_ANSWER,
    TRUNCATED_ANSWER,
)

GateRule = Callable[[Mapping[str, Any]], str | None]
"""A rule: a success row (normalized) to the gate class it derives, or None."""

TRUNCATION_REASONS = frozenset({"length", "max_tokens", "max_output_tokens"})
"""The finish reasons that say a reply stopped at its output-token limit: OpenAI Chat's, Anthropic's
and the Responses API's incomplete reason."""


# --- Reading a success row ---------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, Any] | None:
    # Rows come from json.loads: a dict is the common case, and an ABC check costs ten times more.
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else None


def _result(row: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(row.get("result")) or {}


def _response(row: Mapping[str, Any]) -> Mapping[str, Any] | str | None:
    value = _result(row).get("response")
    if isinstance(value, str):
        return value
    response = _mapping(value)
    if response is None:
        return None
    if isinstance(response.get("output"), list) or "status" in response or "output_text" in response:
        return response
    if _first_choice(response) is not None or _is_message(response):
        return response
    return None


def _is_message(response: Mapping[str, Any]) -> bool:
    """Whether `response` is an Anthropic message (`type` "message", `content` a list)."""
    return response.get("type") == "message" and isinstance(response.get("content"), list)


def _first_choice(response: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = response.get("choices")
    if isinstance(choices, list) and choices:
        return _mapping(choices[0])
    return None


def _text_parts(content: object, part_types: frozenset[str]) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    texts = []
    for part in content:
        part = _mapping(part)
        if part is None:
            continue
        kind = part.get("type")
        if isinstance(kind, str) and kind in part_types and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


def output_text(response: Mapping[str, Any] | str) -> str:
    """The final output text of a Responses object, a chat completion, an Anthropic message or a text
    answer; "" when it has none."""
    if isinstance(response, str):
        return response
    if _is_message(response):
        return "".join(_text_parts(response.get("content"), frozenset({"text"})))
    choice = _first_choice(response)
    if choice is not None:
        message = _mapping(choice.get("message")) or {}
        return "".join(_text_parts(message.get("content"), frozenset({"text", "output_text"})))
    texts: list[str] = []
    output = response.get("output")
    if isinstance(output, list):
        for item in output:
            item = _mapping(item)
            if item is not None and item.get("type") == "message":
                texts.extend(_text_parts(item.get("content"), frozenset({"output_text"})))
    if not "".join(texts).strip() and isinstance(response.get("output_text"), str):
        return str(response["output_text"])
    return "".join(texts)


def _verification(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return _mapping(_result(row).get("verification"))


def _finite_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))  # an int is finite, however long
    )


def has_verdict(row: Mapping[str, Any]) -> bool:
    """Whether a success row holds a measurement: its verification's verdict when it has a
    verification (`False` and `0` are verdicts), else a finite `reward`.

    A finite reward is the measurement, as NeMo Gym scores it (its collector counts a result's
    `reward`, nemo_gym/rollout_collection.py:2758): an agent that returns `{"reward": 1.0, ...}` is
    scored. A verification the agent saved is the grader's own account and decides: one without a
    verdict is `grading_without_verdict`, whatever reward it passed on.
    """
    verification = _verification(row)
    if verification is None:
        return _finite_number(_result(row).get("reward"))
    verdict = verification.get("verdict")
    if isinstance(verdict, str):
        return bool(verdict.strip())
    return isinstance(verdict, bool | int | float)


# --- The rules ---------------------------------------------------------------------------------


def truncated_answer(row: Mapping[str, Any]) -> str | None:
    """`truncated_answer` when the response stopped at its output-token limit."""
    response = _response(row)
    if response is None:
        return None
    if isinstance(response, str):
        result = _result(row)
        reasons = (result.get("finish_reason"), result.get("stop_reason"))
        return TRUNCATED_ANSWER if any(_truncation(reason) for reason in reasons) else None
    if _is_message(response):
        return TRUNCATED_ANSWER if response.get("stop_reason") == "max_tokens" else None
    choice = _first_choice(response)
    if choice is not None:
        return TRUNCATED_ANSWER if choice.get("finish_reason") == "length" else None
    details = _mapping(response.get("incomplete_details")) or {}
    if response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        return TRUNCATED_ANSWER
    return None


def _truncation(reason: object) -> bool:
    return isinstance(reason, str) and reason in TRUNCATION_REASONS


def empty_answer(row: Mapping[str, Any]) -> str | None:
    """`empty_answer` when the response holds no final output text."""
    response = _response(row)
    if response is None:
        return None
    return EMPTY_ANSWER if not output_text(response).strip() else None


def malformed_answer(row: Mapping[str, Any]) -> str | None:
    """`malformed_answer` when the verifier could not extract an answer from non-empty output."""
    response = _response(row)
    verification = _verification(row)
    if response is None or verification is None or "extracted_answer" not in verification:
        return None
    if verification["extracted_answer"] is None and output_text(response).strip():
        return MALFORMED_ANSWER
    return None


def grading_without_verdict(row: Mapping[str, Any]) -> str | None:
    """`grading_without_verdict` when the row holds no measurement (`has_verdict`)."""
    return None if has_verdict(row) else GRADING_WITHOUT_VERDICT


DEFAULT_RULES: tuple[GateRule, ...] = (
    truncated_answer,
    empty_answer,
    malformed_answer,
    grading_without_verdict,
)
"""The default rules, in precedence order (see the module docstring for why)."""


def derive_gate_kind(row: Mapping[str, Any], rules: Sequence[GateRule] = DEFAULT_RULES) -> str | None:
    """The gate class of a success row: the first kind a rule returns, else None."""
    for rule in rules:
        kind = rule(row)
        if kind is not None:
            return kind
    return None
