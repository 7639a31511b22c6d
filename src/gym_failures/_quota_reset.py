"""Quota resets: the time a `provider_quota_exhausted` reason says the quota resets at.

A provider's quota failure names its reset in its reason (``resets at YYYY-MM-DD HH:MM UTC``);
`gym_failures.failures.retry_hint_s` waits until then. Documented, and reached, as
`gym_failures.failure_kinds.quota_reset_text` and `...quota_reset_unix`.
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime

QUOTA_RESET_REGEX = r"resets at (\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC)"
"""The pattern of a reset time in a reason; its one group is the time."""
QUOTA_RESET_PATTERN = re.compile(QUOTA_RESET_REGEX)


def quota_reset_text(reason: object) -> str | None:
    """The UTC time a `provider_quota_exhausted` reason names (`resets at YYYY-MM-DD HH:MM UTC`), else None."""  # noqa: E501 (the reference's own line)
    if not isinstance(reason, str):
        return None
    match = QUOTA_RESET_PATTERN.search(reason)
    if match is None:
        return None
    text = match.group(1)
    try:
        datetime.strptime(text, "%Y-%m-%d %H:%M UTC")
    except ValueError:  # a date that cannot exist, such as 2026-02-30
        return None
    return text


def quota_reset_unix(reason: object) -> float | None:
    """`quota_reset_text` as a unix time, else None."""
    text = quota_reset_text(reason)
    if text is None:
        return None
    return float(calendar.timegm(datetime.strptime(text, "%Y-%m-%d %H:%M UTC").timetuple()))
