"""The summary's groupings: a model for each, computed from the grouped table of `_sql.GROUPED`.

Failure rows are counted by class, kind, boundary, stage, HTTP status and attempt; beside them, by
root cause (`RootCount`: the root's kind, boundary and status with the failure's own kind)
and by HTTP status with the root's status (`StatusCount`). A tainted success row (a success built on
a call that ended in failure: its report names a `failure_id`) is no failure row: it is counted in
its own column (`tainted`) of the kind and root tables, under its failure event's kind and that
event's root, and in no share, class, boundary, stage, status or attempt count.

Responsibility (`classify_failure`) is applied in Python once per distinct (kind, stage, HTTP status),
a handful of groups however many rows there are.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast, get_args

from pydantic import BaseModel, ConfigDict

from gym_failures.failure_kinds import (
    FailureClassificationConfig,
    FailureStage,
    classify_failure,
    quota_reset_text,
)

if TYPE_CHECKING:  # annotations only: the connection is the caller's
    import duckdb

__all__ = [
    "TOP_REASONS",
    "AttemptCount",
    "GroupCount",
    "KindCount",
    "QuotaReset",
    "ReasonCount",
    "RootCount",
    "StatusCount",
    "classify",
    "grouped_counts",
    "nothing_to_show",
    "quota_resets",
    "reported_counts",
    "root_counts",
    "share",
    "status_counts",
    "top_reasons",
]

TOP_REASONS = 10

_STAGES: frozenset[str] = frozenset(get_args(FailureStage))


class GroupCount(BaseModel):
    """Failure rows with one value of a grouping column."""

    model_config = ConfigDict(frozen=True)

    value: str | int | None
    count: int
    final: int
    share: float
    """Of all failure rows."""


def nothing_to_show(groups: Sequence[GroupCount]) -> bool:
    """Whether a grouping has nothing to show: no failure rows, or not one with a value (every value
    `(none)`, such as the HTTP status of runs whose failures had none). The terminal and HTML reports
    leave such a grouping out, with one line saying why, rather than drawing it empty."""
    return all(group.value is None for group in groups)


class KindCount(GroupCount):
    """Failure rows of one kind, with the kind's class (most rows' class when stage or status split it)."""

    failure_class: str
    tainted: int = 0
    """Tainted success rows whose failure event is of this kind (in no share)."""


class AttemptCount(BaseModel):
    """Failure rows of one attempt number, by class."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    count: int
    final: int
    by_class: dict[str, int]


class RootCount(BaseModel):
    """Failure rows whose root cause (`gym_failures.reporting._roots.row_root`; a failure with no
    cause below it is its own) has one kind, boundary and HTTP status, and whose own failure is of
    one kind."""

    model_config = ConfigDict(frozen=True)

    root_kind: str | None
    root_boundary: str | None
    root_http_status: int | None
    kind: str | None
    """The failure row's own kind, as `by_kind` counts it (a tainted row's: its failure event's)."""
    failure_class: str
    """The root's class (most rows' class when stage splits it)."""
    count: int
    final: int
    tainted: int
    """Tainted success rows whose failure has this root (in no share)."""
    share: float
    """Of all failure rows."""


class StatusCount(BaseModel):
    """Failure rows with one HTTP status (the reply's, as `by_http_status` counts it) and one root
    status (their root cause's)."""

    model_config = ConfigDict(frozen=True)

    http_status: int | None
    root_http_status: int | None
    count: int
    final: int
    share: float


class ReasonCount(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str | None
    reason: str
    """Normalized (`gym_failures.reporting._reasons.normalized_reason`: ports, ids, addresses and
    numbers as placeholders), then cut to `REASON_CHARS` characters, the cut marked with "…"."""
    count: int
    example: str | None = None
    """One real reason of the group (the least), cut alike."""


class QuotaReset(BaseModel):
    model_config = ConfigDict(frozen=True)

    resets_at: str
    """`YYYY-MM-DD HH:MM UTC`, as `quota_reset_text` reads it."""
    events: int


def share(count: int, total: int) -> float:
    return round(count / total, 6) if total else 0.0


def classify(
    kind: str | None, stage: str | None, status: int | None, config: FailureClassificationConfig | None
) -> str:
    """The class of a (kind, stage, status); a stage outside the vocabulary is no evidence."""
    valid_stage = cast(FailureStage, stage) if stage in _STAGES else None
    return classify_failure(kind, valid_stage, status, config=config).value


def _ordered(table: dict[Any, list[int]]) -> list[tuple[Any, list[int]]]:
    """Largest count first (then most tainted); ties by value, missing values last, so output is
    stable. A value with neither count nor tainted rows (a torn line subtracted) is left out."""
    return sorted(
        ((key, value) for key, value in table.items() if any(value[::2])),
        key=lambda item: (-item[1][0], -item[1][2], item[0] is None, str(item[0])),
    )


_Key = tuple[str | None, str | None, str | None, int | None, int]


def grouped_counts(
    connection: duckdb.DuckDBPyConnection, failures: int, config: FailureClassificationConfig | None
) -> dict[str, Any]:
    """`by_class`, `by_kind` (with its tainted rows), `by_boundary`, `by_stage`, `by_http_status` and
    `by_attempt`."""
    groups: list[tuple[_Key, int, int]] = [
        ((kind, stage, boundary, status, attempt), int(count), int(final))
        for kind, stage, boundary, status, attempt, count, final in connection.execute(
            """
            SELECT kind, stage, boundary, http_status, attempt, sum(n), coalesce(sum(n) FILTER (final), 0)
            FROM grouped WHERE is_failure
            GROUP BY ALL HAVING sum(n) <> 0
            """
        ).fetchall()
    ]
    tables: dict[str, dict[Any, list[int]]] = {
        name: defaultdict(lambda: [0, 0, 0]) for name in ("class", "kind", "boundary", "stage", "status")
    }
    by_attempt: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    kind_classes: dict[str | None, Counter[str]] = defaultdict(Counter)
    attempt_classes: dict[int, Counter[str]] = defaultdict(Counter)
    classes: dict[tuple[str | None, str | None, int | None], str] = {}
    for (kind, stage, boundary, status, attempt), count, final in groups:
        evidence = (kind, stage, status)
        failure_class = classes.get(evidence)
        if failure_class is None:
            failure_class = classes[evidence] = classify(kind, stage, status, config)
        for name, key in (
            ("class", failure_class),
            ("kind", kind),
            ("boundary", boundary),
            ("stage", stage),
            ("status", status),
        ):
            tables[name][key][0] += count
            tables[name][key][1] += final
        by_attempt[attempt][0] += count
        by_attempt[attempt][1] += final
        kind_classes[kind][failure_class] += count
        attempt_classes[attempt][failure_class] += count
    for kind, tainted, stage, status in connection.execute(
        "SELECT kind, sum(n), min(stage), min(http_status) FROM grouped WHERE tainted GROUP BY kind"
    ).fetchall():
        tables["kind"][kind][2] += int(tainted)
        if not kind_classes[kind]:
            kind_classes[kind][classify(kind, stage, status, config)] += 1

    def counts(table: dict[Any, list[int]]) -> list[GroupCount]:
        return [
            GroupCount(value=key, count=count, final=final, share=share(count, failures))
            for key, (count, final, _) in _ordered(table)
        ]

    return {
        "by_class": counts(tables["class"]),
        "by_kind": [
            KindCount(
                value=key,
                count=count,
                final=final,
                share=share(count, failures),
                failure_class=kind_classes[key].most_common(1)[0][0],
                tainted=tainted,
            )
            for key, (count, final, tainted) in _ordered(tables["kind"])
        ],
        "by_boundary": counts(tables["boundary"]),
        "by_stage": counts(tables["stage"]),
        "by_http_status": counts(tables["status"]),
        "by_attempt": [
            AttemptCount(attempt=attempt, count=count, final=final, by_class=dict(attempt_classes[attempt]))
            for attempt, (count, final, _) in sorted(by_attempt.items())
        ],
    }


def reported_counts(connection: duckdb.DuckDBPyConnection, failures: int) -> list[GroupCount]:
    """Failure rows by the kind the failed call reported (its failure event's, else its kept body's)."""
    return [
        GroupCount(value=kind, count=int(count), final=int(final), share=share(int(count), failures))
        for kind, count, final in connection.execute(
            """
            SELECT reported_kind, sum(n) AS count, coalesce(sum(n) FILTER (final), 0)
            FROM grouped WHERE is_failure AND reported_kind IS NOT NULL
            GROUP BY ALL HAVING count <> 0
            ORDER BY count DESC, reported_kind
            """
        ).fetchall()
    ]


def root_counts(
    connection: duckdb.DuckDBPyConnection, failures: int, config: FailureClassificationConfig | None
) -> list[RootCount]:
    """Failure rows (and, apart, tainted success rows) by root cause and their own kind."""
    table: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
    # The root's class by its failure rows; a root seen under tainted rows only, by those.
    classes: dict[tuple[Any, ...], tuple[Counter[str], Counter[str]]] = defaultdict(
        lambda: (Counter(), Counter())
    )
    for root_kind, boundary, status, stage, kind, count, final, tainted in connection.execute(
        """
        SELECT root_kind, root_boundary, root_status, root_stage, kind,
            coalesce(sum(n) FILTER (is_failure), 0), coalesce(sum(n) FILTER (is_failure AND final), 0),
            coalesce(sum(n) FILTER (tainted), 0)
        FROM grouped WHERE is_failure OR tainted
        GROUP BY ALL
        """
    ).fetchall():
        key = (root_kind, boundary, status, kind)
        for index, value in enumerate((count, final, tainted)):
            table[key][index] += int(value)
        by_failures, by_tainted = classes[key]
        failure_class = classify(root_kind, stage, status, config)
        by_failures[failure_class] += int(count)
        by_tainted[failure_class] += int(tainted)
    ordered = sorted(
        ((key, value) for key, value in table.items() if value[0] or value[2]),
        key=lambda item: (-item[1][0], -item[1][2], *((part is None, str(part)) for part in item[0])),
    )
    return [
        RootCount(
            root_kind=root_kind,
            root_boundary=boundary,
            root_http_status=status,
            kind=kind,
            failure_class=_most_common(*classes[(root_kind, boundary, status, kind)]),
            count=count,
            final=final,
            tainted=tainted,
            share=share(count, failures),
        )
        for (root_kind, boundary, status, kind), (count, final, tainted) in ordered
    ]


def _most_common(by_failures: Counter[str], by_tainted: Counter[str]) -> str:
    counted = +by_failures or +by_tainted or Counter({"unknown": 1})
    return counted.most_common(1)[0][0]


def status_counts(connection: duckdb.DuckDBPyConnection, failures: int) -> list[StatusCount]:
    """Failure rows by their HTTP status and their root cause's."""
    return [
        StatusCount(
            http_status=status,
            root_http_status=root_status,
            count=int(count),
            final=int(final),
            share=share(int(count), failures),
        )
        for status, root_status, count, final in connection.execute(
            """
            SELECT http_status, root_status, sum(n) AS count, coalesce(sum(n) FILTER (final), 0)
            FROM grouped WHERE is_failure
            GROUP BY ALL HAVING count <> 0
            ORDER BY count DESC, http_status NULLS LAST, root_status NULLS LAST
            """
        ).fetchall()
    ]


def top_reasons(connection: duckdb.DuckDBPyConnection) -> list[ReasonCount]:
    """The `TOP_REASONS` most common (kind, normalized reason) pairs, each with one real example."""
    return [
        ReasonCount(kind=kind, reason=reason, count=int(count), example=example)
        for kind, reason, count, example in connection.execute(
            f"""
            SELECT kind, reason, sum(n) AS count, min(example)
            FROM grouped WHERE is_failure AND reason IS NOT NULL AND reason <> ''
            GROUP BY kind, reason HAVING count > 0
            ORDER BY count DESC, reason, kind NULLS LAST
            LIMIT {TOP_REASONS}
            """
        ).fetchall()
    ]


def quota_resets(connection: duckdb.DuckDBPyConnection) -> list[QuotaReset]:
    """The quota reset times the failure rows' reports name, each with its count of events."""
    # The regex is the reference's; `quota_reset_text` then refuses a time that cannot exist (such
    # as February 30), once per distinct text.
    found = connection.execute(
        """
        SELECT resets_at, sum(n) FROM (SELECT unnest(quota) AS resets_at, n FROM grouped)
        WHERE resets_at IS NOT NULL AND resets_at <> ''
        GROUP BY ALL HAVING sum(n) > 0
        """
    ).fetchall()
    resets: Counter[str] = Counter()
    for text, count in found:
        valid = quota_reset_text(f"resets at {text}")
        if valid is not None:
            resets[valid] += int(count)
    return [QuotaReset(resets_at=text, events=count) for text, count in sorted(resets.items())]
