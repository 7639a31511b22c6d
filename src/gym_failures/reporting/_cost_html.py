"""The HTML report's cost section: what the attempts cost, the failed attempts by class, kind and root
cause, and the amplification of model attempts, in the cells `gym-failures summarize` prints
(`gym_failures.reporting._cost`)."""

from __future__ import annotations

from html import escape

from gym_failures.reporting._cost import (
    GROUP_HEADER,
    TOTALS_HEADER,
    Cost,
    amplification_lines,
    group_cells,
    total_cells,
)
from gym_failures.reporting._html_parts import table

__all__ = ["COST_NOTE", "cost_section"]

_NOTE = (
    "Seconds are each attempt's wall time at the collector, tokens what its model replies reported; "
    "shares are of the whole run. A figure no attempt's row carries is not reported: rows from runs "
    "before issue 30 or from NeMo Gym's own collector carry none, and an attempt whose model calls all "
    "failed has no reply to report tokens from; (n of m): only n of the m attempts reported it."
)
COST_NOTE = _NOTE
"""What the cost tables' figures are, and what "not reported" and "(n of m)" mean: below each report's
tables, the terminal's and the HTML's."""


def _figures(first: int) -> frozenset[int]:
    """The numeric columns of a cost table whose figures start at column `first`."""
    return frozenset(range(first, first + len(TOTALS_HEADER) - 1))


def cost_section(cost: Cost) -> str:
    """The section "What failures cost" (the tables of failed attempts left out when none failed, the
    root-cause table when every root is its failure's own kind)."""
    parts = [
        "<h2>What failures cost</h2>",
        f'<p class="dim">{escape(_NOTE)}</p>',
        table(TOTALS_HEADER, total_cells(cost), _figures(1)),
    ]
    if cost.failed_by_class:
        parts += [
            "<h3>Failed attempts' cost by class</h3>",
            table(GROUP_HEADER, group_cells(cost.failed_by_class), _figures(1)),
            "<h3>Failed attempts' cost by kind</h3>",
            table(("kind", *GROUP_HEADER), group_cells(cost.failed_by_kind), _figures(2)),
        ]
        if [line.kind for line in cost.failed_by_root_kind] != [line.kind for line in cost.failed_by_kind]:
            parts += [
                "<h3>Failed attempts' cost by root cause</h3>",
                table(("root kind", *GROUP_HEADER), group_cells(cost.failed_by_root_kind), _figures(2)),
            ]
    amplification = cost.amplification
    parts.append("<h3>Amplification: model attempts per rollout attempt</h3>")
    parts += [f"<p>{escape(line)}</p>" for line in amplification_lines(amplification)]
    if amplification.distribution:
        rows = [(bucket.model_attempts, bucket.attempts) for bucket in amplification.distribution]
        parts.append(table(("model attempts", "rollout attempts"), rows, frozenset({0, 1})))
    if amplification.largest:
        largest = [
            (item.rollout_id, item.attempts, item.model_calls, item.model_attempts)
            for item in amplification.largest
        ]
        parts += [
            "<h3>Largest amplifications (model attempts per rollout)</h3>",
            table(("rollout", "attempts", "model calls", "model attempts"), largest, frozenset({1, 2, 3})),
        ]
    return "\n".join(parts)
