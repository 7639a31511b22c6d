"""Retry rules as a run is given them: `--retry-rule` flags (`parse_rule_flag`) and a rules file
(`load_rules_file`), each refused with a one-line `RetryRuleError` (`gym_failures.collection._retry_rules`).

A flag is `KEY=VALUE` fields separated by commas (`name=limits,kind=provider_quota_exhausted,status=429|5xx,
max_attempts=6`): a list's values are separated by `|`, and `message=` takes the rest of the text, commas
included, so it comes last (a regular expression often holds a comma). A file is JSON
(`{"rules": [{...}, ...]}`) or TOML (`[[rules]]` tables), by its suffix, at most 1 MiB, each rule's keys
the fields of `RetryRule`, a list a JSON or TOML list. No other top-level key is allowed.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from gym_failures.collection._retry_rules import RetryRule, RetryRuleError, RetryRules, one_line, rules_of

MAX_FILE_BYTES: Final = 1024 * 1024
FIELDS: Final = ("name", "kind", "failure_class", "status", "message", "max_attempts", "max_retries_per_run")


def parse_rule_flag(text: str) -> RetryRule:
    """A `--retry-rule` value: `KEY=VALUE` fields separated by commas, such as
    `name=limits,kind=provider_quota_exhausted,status=429|5xx,max_attempts=6`. A list's values are
    separated by `|`; `message=` takes the rest of the text, commas included, so it comes last."""
    fields: dict[str, Any] = {}
    rest = text
    while True:
        key, equals, rest = rest.partition("=")
        key = key.strip()
        if not equals:
            raise RetryRuleError(f"{key[:32]!r} is no KEY=VALUE field" if key else "an empty field")
        if key not in FIELDS:
            raise RetryRuleError(f"unknown key {key[:32]!r} (keys: {', '.join(FIELDS)})")
        if key in fields:
            raise RetryRuleError(f"{key} is given twice")
        if key == "message":
            fields[key] = rest
            break
        value, comma, rest = rest.partition(",")
        fields[key] = _flag_value(key, value.strip())
        if not comma:
            break
    try:
        return RetryRule.model_validate(fields)
    except ValidationError as error:
        problem = one_line(error)
        message = fields.get("message")
        if isinstance(message, str) and any(f",{key}=" in message for key in FIELDS):
            # `message=` took the rest of the value, the fields after it included.
            problem += "; message= takes the rest of the value, commas included: put it last"
        raise RetryRuleError(problem) from None


def _flag_value(key: str, value: str) -> Any:
    if not value:
        raise RetryRuleError(f"{key} has no value")
    if key in ("max_attempts", "max_retries_per_run"):
        try:
            if value.isascii() and value.isdigit():
                return int(value)
        except ValueError:  # past Python's 4300 digits
            pass
        raise RetryRuleError(f"{key} must be a whole number, not {value[:32]!r}")
    if key in ("kind", "failure_class", "status"):
        return [item.strip() for item in value.split("|")]
    return value


def load_rules_file(path: Path) -> RetryRules:
    """The rules of a JSON (`{"rules": [...]}`) or TOML (`[[rules]]`) file, by its suffix."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise RetryRuleError("name a .json or .toml file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise RetryRuleError(f"cannot be read ({error.strerror or type(error).__name__})") from None
    if len(data) > MAX_FILE_BYTES:
        raise RetryRuleError(f"is over {MAX_FILE_BYTES // 1024} KiB")
    try:
        document = tomllib.loads(data.decode("utf-8")) if suffix == ".toml" else json.loads(data)
    except (ValueError, RecursionError) as error:
        first = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise RetryRuleError(f"is no valid {suffix[1:].upper()} ({first})") from None
    if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
        raise RetryRuleError('holds no "rules" list')
    if set(document) != {"rules"}:
        other = sorted(set(document) - {"rules"})[0]
        raise RetryRuleError(f'has a key {other[:32]!r} beside "rules"')
    return rules_of(document["rules"])
