"""Scrubbing a report: the request's own secrets and the registered ones out of every free-text field.

The "scrub" step of the reply pipeline (`gym_failures.reply`, which re-exports `scrub` and documents
the pipeline): a producer's reason may quote the request, so every report a server sends passes here
with the request's credential values (`RequestFailureLog.request_secrets`) before it is fitted and
encoded. It sits below both `gym_failures.reply` and the per-request log (`gym_failures._request_log`)
so that neither imports the other back. A record an app builds and serializes itself scrubs its
texts with the same function (`gym_failures._request_context.scrub_text`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gym_failures._request_context import scrub_text
from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.redaction import has_registered_secrets


def scrub(report: FailureReport, secrets: Sequence[str]) -> FailureReport:
    """`report` without any of `secrets`, any registered secret or any match of a registered pattern
    in a free-text field; `report` itself when none is there."""
    registered = has_registered_secrets()
    if (not secrets and not registered) or not report.events:
        return report

    def without_secrets(text: str, bound: int) -> str:
        return scrub_text(text, secrets, bound, registered=registered)

    changed: dict[str, FailureEvent] = {}
    for event_id, event in report.events.items():
        scrubbed = event.with_texts(without_secrets)
        if scrubbed is not event:
            changed[event_id] = scrubbed
    if not changed:
        return report
    # Only texts changed, so every id and cause link is as valid as before: no revalidation.
    return FailureReport.model_construct(
        events={**report.events, **changed}, failure_id=report.failure_id, omitted=report.omitted
    )
